"""A graph exported for StarPU's SimGrid mode: the export round-trips, the replay program reads it as written,
and (where StarPU has been built with SimGrid under $TILECAST_HOME) simulates it from the real runs' histories."""

import shutil
import subprocess

import numpy as np
import pytest

from sim_graphs import gemm_chain_graph
from tilecast.executor.simgrid_build import compile_replay, simgrid_built
from tilecast.executor.simgrid_replay import export_graph, read_export, tile_layout
from tilecast.kernels import all_kernels


@pytest.fixture(scope="module")
def graph():
    return gemm_chain_graph(n_layers=2, tiles=3, tile=32)


@pytest.mark.parametrize("with_priority", [False, True])
def test_export_round_trips(tmp_path, graph, with_priority):
    prio = np.arange(graph.n_tasks, dtype=np.int32)[::-1] - 5 if with_priority else None
    back = read_export(export_graph(graph, tmp_path / "g.bin", prio))
    assert back["kernels"] == [k.name for k in all_kernels()]
    nelem, elemsize = tile_layout(graph)
    assert (back["nelem"] * back["elemsize"] == graph.tile_nbytes).all()
    assert (back["nelem"] == nelem).all() and (back["elemsize"] == 4).all()
    for name in ("kernel", "acc_ptr", "acc_tile", "acc_mode"):
        assert (back[name] == getattr(graph, name)).all(), name
    if with_priority:
        assert (back["priority"] == prio).all()
    else:
        assert back["priority"] is None


def _summary(graph, prio):
    """What the parse-only replay program prints for ``graph``, computed here."""
    names = [k.name for k in all_kernels()]
    acc = np.arange(len(graph.acc_tile), dtype=np.int64)
    checks = int(((acc + 1) * graph.acc_mode.astype(np.int64) + graph.acc_tile).sum())
    pchk = int(((np.arange(graph.n_tasks) + 1) * prio.astype(np.int64)).sum()) if prio is not None else 0
    lines = [f"kernels {len(names)} tiles {graph.n_tiles} tasks {graph.n_tasks} accesses {len(graph.acc_tile)} "
             f"priorities {int(prio is not None)}"]
    task_bytes = np.add.reduceat(graph.tile_nbytes[graph.acc_tile].astype(np.int64), graph.acc_ptr[:-1])
    for k, name in enumerate(names):
        sel = graph.kernel == k
        if sel.any():
            lines.append(f"kernel {name} tasks {int(sel.sum())} bytes {int(task_bytes[sel].sum())}")
    lines.append(f"checksum {checks} {pchk}")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def parser(tmp_path_factory):
    if not shutil.which("cc"):
        pytest.skip("no C compiler: the replay program's reader cannot be built")
    return compile_replay(tmp_path_factory.mktemp("replay") / "parse_only", [], parse_only=True)


@pytest.mark.parametrize("with_priority", [False, True])
def test_replay_program_reads_the_export(tmp_path, graph, parser, with_priority):
    prio = (np.arange(graph.n_tasks, dtype=np.int32) * 7 - 100) if with_priority else None
    path = export_graph(graph, tmp_path / "g.bin", prio)
    out = subprocess.run([str(parser), str(path)], capture_output=True, text=True, check=True).stdout
    assert out == _summary(graph, prio)


def test_replay_program_refuses_a_damaged_export(tmp_path, graph, parser):
    path = export_graph(graph, tmp_path / "g.bin")
    data = path.read_bytes()
    (tmp_path / "short.bin").write_bytes(data[:-3])
    (tmp_path / "long.bin").write_bytes(data + b"x")
    for name in ("short.bin", "long.bin"):
        res = subprocess.run([str(parser), str(tmp_path / name)], capture_output=True, text=True)
        assert res.returncode == 2 and "simgrid_replay:" in res.stderr, name


def test_simgrid_replays_a_serial_run_from_the_history(graph):
    """On one worker the simulated makespan is the sum of the tasks' history means (what SimGrid executes)
    plus StarPU's simulated per-task costs."""
    if not simgrid_built():
        pytest.skip("StarPU with SimGrid is not built under $TILECAST_HOME (benchmarks/vs_starpu_simgrid.py "
                    "builds it); the replay itself is not exercised")
    from tilecast.executor.simgrid_replay import simgrid_makespans, starpu_hostname
    from tilecast.executor.starpu_session import StarPUSession, starpu_home
    from tilecast.reference.tiles import TileStore
    from tilecast.perfmodel.starpu_history import history_files, read_history

    store = TileStore(graph)
    store.allocate_all()
    for b in store.buffers:
        b[:] = 0.01
    # dmda asks for the gemm footprint's expected length, so StarPU records its durations (>= 10 samples)
    with StarPUSession("dmda", 1) as s:
        for _ in range(2):
            s.execute(graph, store, trace=False)
    run = simgrid_makespans(graph, "eager", 1, starpu_home(), steps=2)
    assert run.workers == 1
    codelets = starpu_home() / ".starpu" / "sampling" / "codelets"
    path = history_files(str(codelets))["gemm"]
    assert path.endswith("." + starpu_hostname())
    size = int(graph.tile_nbytes[graph.acc_tile[:3]].sum())
    rows = [r for r in read_history(path) if r.size == size and r.n > 0]
    assert len(rows) == 1, rows
    executed = graph.n_tasks * rows[0].mean_s  # every task lasts its footprint's history mean in SimGrid
    # StarPU's SimGrid mode adds its own modelled costs (1 us per submission, per input fetched, ...)
    for m in run.makespans_s:
        assert executed <= m <= executed + graph.n_tasks * 10e-6
    assert run.makespans_s[0] == pytest.approx(run.makespans_s[1], rel=1e-6)  # virtual time: no jitter
    # per worker: the one worker ran every task, busy for their history means (StarPU's task profiling)
    assert run.worker_tasks == [graph.n_tasks]
    assert run.worker_busy_s[0] == pytest.approx(executed, rel=1e-3)


def test_build_says_what_is_missing(tmp_path, monkeypatch):
    """Without a build under $TILECAST_HOME, the build names what it needs instead of failing later."""
    from tilecast.executor.simgrid_build import ensure_starpu_simgrid
    from tilecast.kernels.native_build import NativeUnavailable

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TILECAST_STARPU_SRC", raising=False)
    assert not simgrid_built()
    with pytest.raises(NativeUnavailable, match="apt-get source starpu"):
        ensure_starpu_simgrid()
    with pytest.raises(NativeUnavailable, match="not a StarPU source tree"):
        ensure_starpu_simgrid(tmp_path)
    (tmp_path / "configure").write_text("")
    (tmp_path / "configure.ac").write_text("AC_INIT([StarPU], [1.4.7], [x])\n")
    with pytest.raises(NativeUnavailable, match="StarPU 1.4.7, expected 1.3.10"):
        ensure_starpu_simgrid(tmp_path)
    assert not (tmp_path / "home" / "starpu-simgrid").exists()
