"""The forecast of memory-limited steps: main memory capped at the limit, StarPU's LRU eviction with write-back
to a disk node, the disk node's measured speed, and simulate/tune --memory-limit."""

import json
import os
from dataclasses import replace

import numpy as np
import pytest
import yaml
from sim_machines import KIND, cpu_machine, fig

from tilecast.cli import main
from tilecast.executor.memory_limit import minimum_bytes
from tilecast.graph import GraphBuilder, Tiling
from tilecast.graph.model_config import load_model
from tilecast.graph.models import build_step
from tilecast.perfmodel import load_machine
from tilecast.perfmodel.disk_node import (DiskNode, disk_path, load_disk, measure_and_store, measure_disk, save_disk,
                                          stored_disk)
from tilecast.simulator.engine import SimulationError
from tilecast.simulator.memory_capacity import Throttled, simulate_memory_limited
from tilecast.simulator.policies.central import Eager

TILE = 64
S = TILE * TILE * 4  # bytes of one tile
DISK = DiskNode(write_bandwidth=1e8, read_bandwidth=2e8, write_latency=1e-4, read_latency=5e-5)


def two_axpys():
    """Four parameter tiles t0..t3; task 0: t1 += a t0, task 1: t3 += a t2."""
    b = GraphBuilder(Tiling.uniform(TILE))
    t = b.tensor("p", (4 * TILE, TILE), ("seq", None), "param")
    for x, y in ((0, 1), (2, 3)):
        b.add("axpy", [t.tile_ids(x, 0), t.tile_ids(y, 0)], dict(n=TILE * TILE, alpha=0.5))
    return b.build()


def test_eviction_by_hand():
    """Limit 3 tiles, one worker, no warm-up, no throttle. At the start t1, t2, t3 are in memory (the last loaded;
    LRU order t1, t2, t3), dirty (their only copy), and t0 on disk.
    Task 0 reads t0: memory is full and no clean tile can give its memory, so StarPU reclaims 2 tiles: LRU t1 is
    in use, t2 and t3 are written back, then t0 is read (and stays valid on disk too). Task 1 reads t2 (there is
    room), then t3 needs room: the LRU clean tile of its size, t0, gives its memory (dropped, no write), then t3
    is read. 3 evictions, 2 write-backs, 1 dropped, 2 tiles written, 3 read; one transfer at a time on disk.
    The two searches for a tile to reuse walk past t1, t2, t3 (none taken), then take t0, the first tile of the
    list then (t1, just used by task 0, is behind it): 4 tiles walked; 3 tiles held never call for tidying."""
    d = 1e-3
    res = simulate_memory_limited(two_axpys(), cpu_machine(1), 3 * S, DISK, "eager", durations=np.full((1, 2), d),
                                  warmup=False, throttle=None)
    s = res.summary
    assert (s["evictions"], s["writebacks"], s["dropped"]) == (3, 2, 1)
    assert (s["reuse_searches"], s["reuse_walked"], s["tidy_passes"], s["tidy_walked"]) == (2, 4, 0, 0)
    assert (s["disk_written_bytes"], s["disk_read_bytes"]) == (2 * S, 3 * S)
    w, r = DISK.write_s(S), DISK.read_s(S)
    # task 0 starts after 2 write-backs and a read; task 1 after two reads
    assert res.makespan == pytest.approx((2 * w + r + d) + (2 * r + d), rel=1e-12)
    assert s["peak_memory_bytes"]["host"] <= 3 * S
    assert s["bytes_per_link"] == {"disk-write:host->disk": 2 * S, "disk-read:disk->host": 3 * S}


def by_hand(disk, d: float = 1e-3):
    """The steps of test_eviction_by_hand (limit 3 tiles, one worker, tasks of ``d`` s) with ``disk``."""
    return simulate_memory_limited(two_axpys(), cpu_machine(1), 3 * S, disk, "eager", durations=np.full((1, 2), d),
                                   warmup=False, throttle=None)


def test_starpu_cost_grows_with_the_tiles_in_memory():
    """The same steps as test_eviction_by_hand with StarPU's cost per disk transfer and tile held in main memory
    (walk_s): the transfers see 2, 1 (write-backs of t2 then t3), 1 (t0 read), 2 and 2 (t2, t3 read) tiles held,
    so the serial step is 8 walk_s longer, and the counters do not change."""
    walk = 1e-4
    plain, res = by_hand(DISK), by_hand(replace(DISK, walk_s=walk))
    assert res.makespan == pytest.approx(plain.makespan + 8 * walk, rel=1e-12)
    assert res.summary["resident_per_transfer"] == pytest.approx(8 / 5)
    for k in ("evictions", "writebacks", "dropped", "disk_written_bytes", "disk_read_bytes"):
        assert res.summary[k] == plain.summary[k]


def test_search_for_a_tile_to_reuse_costs_its_worker_per_tile_walked():
    """The steps of test_eviction_by_hand with StarPU's cost per tile walked past in its search for a tile to reuse
    (walk_tile_s): the two searches walk 3 and 1 tiles, each charged to the task whose allocation searched, so the
    serial step is 4 walk_tile_s longer and nothing else changes."""
    walk = 1e-4
    plain, res = by_hand(DISK), by_hand(replace(DISK, walk_tile_s=walk))
    assert res.makespan == pytest.approx(plain.makespan + 4 * walk, rel=1e-12)
    assert list(res.task_costs) == pytest.approx([3 * walk, walk], rel=1e-12)
    assert res.summary["reuse_walk_s"] == pytest.approx(4 * walk, rel=1e-12) and plain.summary["reuse_walk_s"] == 0
    for k in ("evictions", "writebacks", "dropped", "disk_written_bytes", "disk_read_bytes", "reuse_walked"):
        assert res.summary[k] == plain.summary[k]


def test_no_eviction_when_everything_fits_and_too_small_is_an_error():
    res = simulate_memory_limited(two_axpys(), cpu_machine(1), 4 * S, DISK, "eager", durations=np.full((1, 2), 1e-3))
    assert res.summary["evictions"] == 0 and res.summary["disk_read_bytes"] == 0
    assert res.makespan == pytest.approx(2e-3)
    with pytest.raises(SimulationError, match="working set"):  # a task's two tiles cannot both be held
        simulate_memory_limited(two_axpys(), cpu_machine(1), S, DISK, "eager", durations=np.full((1, 2), 1e-3))


def test_tidying_writes_back_ahead_of_need():
    """20 dirty tiles in memory, none clean: below StarPU's 5% of clean tiles, so the 2 least recently used
    dirty tiles not in use (t22, t23: t20 and t21 were just used) are written back (10% clean), in one pass that
    looks at those two tiles; the task does not wait for them."""
    b = GraphBuilder(Tiling.uniform(TILE))
    t = b.tensor("p", (40 * TILE, TILE), ("seq", None), "param")
    b.add("axpy", [t.tile_ids(20, 0), t.tile_ids(21, 0)], dict(n=TILE * TILE, alpha=0.5))
    g = b.build()
    for tidy, written in ((True, 2 * S), (False, 0)):
        res = simulate_memory_limited(g, cpu_machine(1), 20 * S, DISK, "eager", durations=np.full((1, 1), 1e-3),
                                      warmup=False, throttle=None, tidy=tidy)
        s = res.summary
        assert (s["disk_written_bytes"], s["tidied"], s["evictions"]) == (written, written // S, 0)
        assert (s["tidy_passes"], s["tidy_walked"]) == ((1, 2) if tidy else (0, 0))
        assert res.makespan == pytest.approx(1e-3)


def test_throttle_submits_in_order_within_the_window():
    """Independent tasks on one worker, window max 2 / min 1: tasks start in id order and the policy never
    holds more than 3 submitted tasks (StarPU submits while at most max are in flight)."""
    b = GraphBuilder(Tiling.uniform(TILE))
    t = b.tensor("p", (8 * TILE, TILE), ("seq", None), "param")
    for i in range(4):
        b.add("axpy", [t.tile_ids(2 * i, 0), t.tile_ids(2 * i + 1, 0)], dict(n=TILE * TILE, alpha=0.5))
    g = b.build()
    res = simulate_memory_limited(g, cpu_machine(1), 64 * S, DISK, "eager", durations=np.full((1, 4), 1e-3),
                                  throttle=(2, 1))
    assert np.all(np.diff(res.start) > 0)
    pol = Throttled(Eager(None), 2, 1)
    assert pol.name == "eager" and not pol.fused_run()


def test_disk_measured_stored_and_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECAST_HOME", str(tmp_path / "home"))
    disk = measure_disk(str(tmp_path), total_bytes=1 << 20, repeats=1)
    assert disk.write_bandwidth > 0 and disk.read_bandwidth > 0 and disk.write_latency >= 0
    assert disk.directory == str(tmp_path) and "pwrite" in disk.source
    machine = cpu_machine(2)
    path = save_disk(machine, disk)
    assert path == disk_path(machine) and load_disk(path) == disk == stored_disk(machine)
    save_disk(machine, replace(disk, runtime_latency=1e-3, walk_s=1e-7, runtime_source="fitted on a run"))
    again, _ = measure_and_store(machine, str(tmp_path), total_bytes=1 << 20, repeats=1)
    assert again.runtime_latency == 1e-3 == stored_disk(machine).runtime_latency  # a re-measurement keeps the fit
    assert again.walk_s == 1e-7 == stored_disk(machine).walk_s and "100 ns x tiles in memory" in again.describe()
    assert again.write_s(S) == pytest.approx(1e-3 + again.write_latency + S / again.write_bandwidth)


TINY = ["--model", "gpt2-tiny", "--batch", "2", "--seq", "32", "--tile", "32"]


@pytest.fixture
def machine_file(tmp_path):
    """A two-worker CPU machine (roofline figures) as a file, with its disk node stored for ``tmp_path``."""
    doc = {"format": 1, "name": "test-oocsim-cpu", "runtime": {"task_overhead_us": fig(1.0)},
           "memory_nodes": [{"name": "host", "kind": "ram", "capacity_GiB": fig(64)}],
           "worker_kinds": {"cpu": KIND},
           "workers": [{"name": "cpu", "kind": "cpu", "count": 2, "memory_node": "host"}]}
    path = tmp_path / "machine.yaml"
    path.write_text(yaml.safe_dump(doc))
    machine = load_machine(str(path))
    disk_file = save_disk(machine, DiskNode(1e9, 2e9, 2e-5, 1e-5, str(tmp_path), "test figures"))
    yield str(path)
    import os

    os.remove(disk_file)


def test_simulate_memory_limit_evicts_to_disk(machine_file, tmp_path, capsys):
    assert main(["simulate", *TINY, "--machine", machine_file, "--memory-limit", "2MiB", "--offload-dir",
                 str(tmp_path), "--no-trace", "--json"]) == 0  # 2.98 MiB of tiles
    doc = json.loads(capsys.readouterr().out)
    assert doc["memory_limit_bytes"] == 2 << 20
    assert doc["evictions"] > 0 and doc["writebacks"] > 0
    assert doc["disk_written_bytes"] > 0 and doc["disk_read_bytes"] > 0
    assert doc["peak_memory_bytes"]["host"] <= 2 << 20
    assert main(["simulate", *TINY, "--machine", machine_file, "--no-trace", "--json"]) == 0
    unlimited = json.loads(capsys.readouterr().out)
    assert doc["step_s"] > unlimited["step_s"]  # the disk traffic costs time


def test_simulate_below_minimum_is_refused_in_one_line(machine_file, tmp_path, capsys):
    assert main(["simulate", *TINY, "--machine", machine_file, "--memory-limit", "1MiB", "--offload-dir",
                 str(tmp_path), "--no-trace"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    refusals = [line for line in err if line.startswith("tilecast simulate:")]  # after the progress line
    assert refusals == [err[-1]] and err[-1].startswith("tilecast simulate: --memory-limit: 1.00 MiB is below")
    assert "the minimum is 2MiB" in err[-1]


def test_tune_ranks_only_settings_that_fit(machine_file, tmp_path, capsys):
    cfg = load_model("gpt2-tiny")
    need = {(t, w): minimum_bytes([build_step(cfg, 4, 128, Tiling.parse(t))], w, True) for t in ("32", "64")
            for w in (1, 2)}
    limit = 2 << 20
    assert need[("32", 2)] <= limit < need[("64", 2)]  # 1.32 and 2.26 MiB; tile 64 on one worker: 1.75 MiB
    assert main(["tune", "--model", "gpt2-tiny", "--batch", "4", "--seq", "128", "--tiles", "32;64",
                 "--worker-counts", "1,2", "--scheds", "dmda", "--machine", machine_file, "--memory-limit", str(limit),
                 "--offload-dir", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    ranked = {(r["tiling"], r["workers"], r["recompute"]) for r in doc["ranking"]}
    refused = {(s["tiling"], s["workers"]) for s in doc["skipped"]}
    assert all(r["fits"] for r in doc["ranking"]) and {rc for _, _, rc in ranked} == {"none", "selective", "full"}
    for (t, w), n in need.items():
        label = Tiling.parse(t).describe()
        assert ((label, w) in refused) == (n > limit), (t, w)
        assert all((label, w, rc) not in ranked for rc in ("none", "selective", "full")) == ((label, w) in refused)
    assert all("smallest working set" in s["reason"] for s in doc["skipped"])
    steps = [r["pred_step_s"] for r in doc["ranking"]]
    assert steps == sorted(steps)


def test_no_prefetch_under_a_limit_unless_asked(monkeypatch):
    """A memory-limited StarPU starts with STARPU_PREFETCH=0 (its failed prefetches walk every tile in memory),
    the environment's choice wins, and the forecast counts the walks' cost only for a prefetching run."""
    from tilecast.executor.memory_limit import MemoryLimit, limit_prefetches
    from tilecast.executor.starpu_session import limit_environment

    monkeypatch.delenv("STARPU_PREFETCH", raising=False)
    assert not limit_prefetches()
    env = limit_environment(MemoryLimit(64 << 20, None), 2)
    with env:
        assert os.environ["STARPU_PREFETCH"] == "0" and os.environ["STARPU_LIMIT_CPU_MEM"] == "64"
    assert "STARPU_PREFETCH" not in os.environ  # restored
    monkeypatch.setenv("STARPU_PREFETCH", "1")
    assert limit_prefetches() and limit_environment(MemoryLimit(64 << 20, None), 2).env["STARPU_PREFETCH"] == "1"
    assert limit_environment(None, 2).env == {}


def test_initial_parameters_drawn_in_chunks_are_the_same(monkeypatch):
    """normal32 draws a tensor a chunk at a time (no float64 copy of a whole tensor while a limited run loads
    it): the values are those of one draw of the whole tensor, for chunks that do not divide it."""
    from tilecast.reference import step

    whole = np.random.default_rng(7).normal(0.0, 0.02, (37, 29)).astype(np.float32)
    monkeypatch.setattr(step, "DRAW_CHUNK", 100)
    got = step.normal32(np.random.default_rng(7), 0.02, (37, 29))
    assert got.dtype == np.float32 and np.array_equal(got, whole)
