"""StarPU session: scheduler and worker validation, pausing, shutdown on every exit path."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from tilecast.executor.sample_graphs import tiled_matmul_gelu
from tilecast.executor.starpu_session import StarPUSession, max_workers, policies
from tilecast.reference.tiles import TileStore

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, env_extra=None, **kw):
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(env_extra or {}))
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def test_policies_include_the_usual_schedulers():
    offered = policies()
    assert {"eager", "dmda", "lws", "ws", "prio"} <= set(offered)
    assert all(isinstance(d, str) and d for d in offered.values())


def test_unknown_scheduler_lists_the_offered_ones():
    with pytest.raises(ValueError, match=r"unknown scheduler 'fastest'.*dmda.*eager"):
        StarPUSession("fastest")


def test_withheld_scheduler_says_why():
    from tilecast.executor.starpu_session import WITHHELD

    for name, why in WITHHELD.items():
        assert name not in policies()
        with pytest.raises(ValueError, match="not available"):
            StarPUSession(name)


@pytest.mark.parametrize("workers", [0, 1000])
def test_bad_worker_count_is_refused(workers):
    with pytest.raises(ValueError, match=f"between 1 and {max_workers()}"):
        StarPUSession("eager", workers)


def test_session_pauses_workers_while_python_works(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    g = tiled_matmul_gelu(40, 30, 20, 16)
    store = TileStore(g)
    rng = np.random.default_rng(0)
    store.set_tensor("a", rng.standard_normal((40, 30)).astype(np.float32))
    store.set_tensor("b", rng.standard_normal((30, 20)).astype(np.float32))
    with StarPUSession("dmda", 2) as s:
        assert s.n_workers == 2 and s.worker_names == ["CPU 0", "CPU 1"]
        s.execute(g, store)
        before = sum(os.times()[:2])
        time.sleep(0.5)
        busy = sum(os.times()[:2]) - before
    print(f"idle session: {busy:.3f} s of CPU in 0.5 s")
    # Two unpaused workers would burn about 1 s of CPU in 0.5 s of wall time.
    assert busy < 0.15, f"idle session used {busy:.2f} s of CPU in 0.5 s"
    assert not s.is_open
    # StarPU's files (bus calibration, per-kernel history models) live under TILECAST_HOME.
    models = list((tmp_path / "starpu").rglob("gemm*"))
    assert models, "no gemm performance model written under $TILECAST_HOME/starpu"


def test_two_sessions_cannot_overlap():
    with StarPUSession("eager", 1):
        with pytest.raises(RuntimeError, match="already open"):
            StarPUSession("eager", 1).start()
    with StarPUSession("eager", 1) as s:  # and a new one starts after the first closed
        assert s.n_workers == 1


def test_error_inside_session_still_shuts_down():
    with pytest.raises(ZeroDivisionError):
        with StarPUSession("eager", 1) as s:
            1 / 0
    assert not s.is_open
    with StarPUSession("eager", 1) as s2:
        assert s2.is_open


def test_ctrl_c_during_execution_stops_cleanly():
    p = _python("""
        import faulthandler, signal, sys
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # where it is, should it ever hang
        # Ctrl-C as from a terminal: a runner started in the background passes SIGINT on ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from tilecast.executor.sample_graphs import tiled_matmul_gelu
        from tilecast.executor.starpu_session import StarPUSession
        from tilecast.reference.tiles import TileStore
        g = tiled_matmul_gelu(1536, 1536, 1536, 256)
        store = TileStore(g); store.allocate_all()
        for b in store.buffers: b[:] = 0.01
        try:
            with StarPUSession("eager", 2) as s:
                print("running", flush=True)
                while True:
                    s.execute(g, store)
        except KeyboardInterrupt:
            print("interrupted, session open:", s.is_open, flush=True)
            sys.exit(130)
    """)
    assert p.stdout.readline().strip() == "running"
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"StarPU did not stop within 30 s of Ctrl-C; output: {out!r}; Python stacks:\n{err[-4000:]}")
    assert p.returncode == 130, err
    assert "interrupted, session open: False" in out


def test_without_starpu_execution_names_what_to_install():
    p = _python("""
        from tilecast.executor.sample_graphs import tiled_matmul_gelu
        from tilecast.executor.starpu_session import StarPUSession
        from tilecast.kernels.native_build import NativeUnavailable
        g = tiled_matmul_gelu(8, 8, 8, 4)   # graphs still build
        print("tasks", g.n_tasks)
        try:
            StarPUSession("eager", 1)
        except NativeUnavailable as e:
            print("error:", e)
    """, env_extra={"TILECAST_STARPU_PKG": "starpu-not-installed"})
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "tasks 12" in out
    assert "error: StarPU not found" in out and "apt-get install libstarpu-dev" in out
    assert out.count("\n") == 2, "the error must be one line"


def test_every_offered_scheduler_runs_a_graph_correctly():
    p = _python("""
        import numpy as np
        from tilecast.executor.sample_graphs import reference_matmul_gelu, tiled_matmul_gelu
        from tilecast.executor.starpu_session import StarPUSession, policies
        from tilecast.reference.tiles import TileStore
        g = tiled_matmul_gelu(40, 24, 30, 16)
        rng = np.random.default_rng(0)
        a = rng.standard_normal((40, 24)).astype(np.float32)
        b = rng.standard_normal((24, 30)).astype(np.float32)
        want = reference_matmul_gelu(a, b)
        for sched in policies():
            store = TileStore(g)
            store.set_tensor("a", a)
            store.set_tensor("b", b)
            with StarPUSession(sched, 2) as s:
                trace = s.execute(g, store)
            err = np.abs(store.tensor("y") - want).max() / np.abs(want).max()
            print(sched, "ok" if err < 1e-5 and len(trace) == g.n_tasks else f"wrong {err}", flush=True)
    """)
    try:
        out, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"a scheduler hung; last finished: {out.strip().splitlines()[-1:]}")
    assert p.returncode == 0, err
    results = dict(line.split(" ", 1) for line in out.strip().splitlines())
    assert set(results) == set(policies())
    assert all(r == "ok" for r in results.values()), results


def test_ctrl_c_is_left_to_the_main_thread():
    """StarPU's threads block SIGINT, so Python's handler (main thread) always gets a Ctrl-C."""
    import threading

    def sigint_blocked(tid: int) -> bool:
        with open(f"/proc/self/task/{tid}/status") as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigBlk:"))
        return bool(mask & (1 << (signal.SIGINT - 1)))

    main_tid = threading.get_native_id()
    before = set(map(int, os.listdir("/proc/self/task")))
    with StarPUSession("eager", 2):
        started = set(map(int, os.listdir("/proc/self/task"))) - before
        assert started, "StarPU started no thread"
        assert all(sigint_blocked(t) for t in started)
        assert not sigint_blocked(main_tid)
