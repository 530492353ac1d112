"""StarPU's own costs under a memory limit: the per-task events the simulator charges them for, the fit of those
costs on per-task delays, and calibrate's fit of them on a probe step run on StarPU with a real disk node."""

from dataclasses import replace

import numpy as np
import pytest
from sim_machines import cpu_machine
from test_memory_forecast import DISK, S, two_axpys

from tilecast.graph import Tiling
from tilecast.graph.model_config import load_model
from tilecast.graph.models import build_step
from tilecast.loop.disk_fit import EVENTS, calibrate_worker_costs, fit_event_costs, task_delays
from tilecast.perfmodel.disk_node import load_disk, measure_and_store, save_disk
from tilecast.simulator.memory_capacity import simulate_memory_limited


def test_task_delays_by_hand():
    """Task 2 depends on task 0; worker 0 runs 0 then 2, worker 1 runs 1. Task 0 starts 1 ms after the step's
    start, task 1 at once, task 2 3 ms after task 0 ended (it could start then: its worker free, its predecessor
    done)."""
    start, end, worker = [1e-3, 0.0, 6e-3], [3e-3, 5e-3, 7e-3], [0, 1, 0]
    pred_ptr, pred = np.array([0, 0, 0, 1]), np.array([0])
    assert task_delays(start, end, worker, pred_ptr, pred) == pytest.approx([1e-3, 0.0, 3e-3])


def test_event_costs_recovered_from_delays():
    rng = np.random.default_rng(0)
    n = 500
    events = {k: rng.integers(0, 3, n) for k in EVENTS}
    events["read_bytes"] = events["reads"] * rng.choice([4096, 16384], n)
    events["writeback_bytes"] = events["writebacks"] * rng.choice([4096, 65536], n)
    true = {"per_task": 50e-6, "allocs": 0.0, "reads": 300e-6, "writebacks": 200e-6, "drops": 20e-6,
            "read_bytes": 1e-9, "writeback_bytes": 0.0}
    sim = rng.uniform(0, 1e-4, n)
    real = sim + true["per_task"] + sum(true[k] * events[k] for k in EVENTS)
    got = fit_event_costs([real, real], sim, events)
    for k, v in true.items():
        assert got[k] == pytest.approx(v, abs=1e-9)


def test_task_events_and_the_cost_charged_for_them():
    """test_memory_forecast.test_eviction_by_hand's step: task 0 allocates t0, writes t2 and t3 back and reads
    t0; task 1 allocates and reads t2, then t3, which takes the memory of t0 (evicted clean). With StarPU's
    costs in the worker, the serial step is longer by exactly what those events cost."""
    d = 1e-3
    run = {"durations": np.full((1, 2), d), "warmup": False, "throttle": None}
    plain = simulate_memory_limited(two_axpys(), cpu_machine(1), 3 * S, DISK, "eager", **run)
    ev = plain.task_events
    assert list(ev["allocs"]) == [1, 2] and list(ev["reads"]) == [1, 2]
    assert list(ev["writebacks"]) == [2, 0] and list(ev["drops"]) == [0, 1]
    assert list(ev["read_bytes"]) == [S, 2 * S] and list(ev["writeback_bytes"]) == [2 * S, 0]
    s = plain.summary
    assert (ev["reads"].sum(), ev["writebacks"].sum(), ev["drops"].sum()) == (s["disk_reads"], s["writebacks"],
                                                                               s["dropped"])
    costs = {"per_task": 1e-4, "allocs": 1e-5, "reads": 3e-4, "writebacks": 2e-4, "drops": 5e-5,
             "read_bytes": 1e-9, "writeback_bytes": 2e-9}
    charged = simulate_memory_limited(two_axpys(), cpu_machine(1), 3 * S, replace(DISK, worker_costs=costs),
                                      "eager", **run)
    extra = sum(costs[k] * float(np.sum(ev[k])) for k in EVENTS) + 2 * costs["per_task"]
    assert charged.makespan == pytest.approx(plain.makespan + extra, rel=1e-12)
    assert charged.summary["disk_read_bytes"] == s["disk_read_bytes"]


def test_a_run_without_prefetch_reads_every_tile_for_a_task():
    """dmda under a limit: without prefetches (memory-limited runs start StarPU with STARPU_PREFETCH=0) every
    read from the disk is one a task waits for; with them some are brought ahead, when the task is pushed."""
    g = build_step(load_model("gpt2-tiny"), 2, 32, Tiling.parse("32"))
    durations = np.full((1, g.n_tasks), 2e-5)
    reads = {}
    for pf in (False, True):
        res = simulate_memory_limited(g, cpu_machine(2), 1 << 20, DISK, "dmda", durations=durations, prefetches=pf)
        reads[pf] = (int(res.task_events["reads"].sum()), res.summary["disk_reads"])
    assert reads[False][0] == reads[False][1] > 0
    assert reads[True][0] < reads[True][1]


def test_worker_costs_stored_and_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECAST_HOME", str(tmp_path / "home"))
    machine = cpu_machine(2)
    costs = {"per_task": 1e-4, "reads": 2e-4}
    path = save_disk(machine, replace(DISK, worker_costs=costs, worker_costs_source="fitted on probes"))
    assert load_disk(path).worker_costs == costs
    again, _ = measure_and_store(machine, str(tmp_path), total_bytes=1 << 20, repeats=1)
    assert again.worker_costs == costs and again.worker_costs_source == "fitted on probes"
    assert "100 us per task, 200 us per tile read back" in again.describe()


def test_calibrate_fits_starpu_costs_on_a_probe_step(tmp_path, monkeypatch):
    """A probe step of gpt2-tiny (batch 1 x 64, tile 32, 2 MiB, of about 3 MiB of tiles: every step evicts) on
    StarPU with a disk node in a real directory: the costs fitted are non-negative, some positive, and the probe's forecast with them
    is far closer to its measured step than the file system's figures alone."""
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.disk_node import measure_disk

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path / "home"))
    offload = tmp_path / "offload"
    offload.mkdir()
    machine = load_machine("local")
    disk = measure_disk(str(offload), total_bytes=1 << 20, repeats=1)
    fitted, rows = calibrate_worker_costs(machine, disk, str(offload), [("gpt2-tiny", 1, 64, "32", 2 << 20)])
    c = fitted.worker_costs
    assert set(c) == {"per_task", *EVENTS} and min(c.values()) >= 0 and max(c.values()) > 0
    assert fitted.runtime_latency == 0 and "probe steps" in fitted.worker_costs_source
    (row,) = rows
    print(row, fitted.describe())
    base_err = abs(row["base_step_s"] - row["measured_step_s"]) / row["measured_step_s"]
    assert abs(row["error"]) < 0.5 and abs(row["error"]) < base_err


def test_a_step_is_charged_the_costs_fitted_on_its_own_worker_count():
    """Costs fitted on one worker and on two: a one-worker forecast charges the first, a two-worker one the
    second, a count without its own fit ``worker_costs``."""
    one = {"per_task": 1e-4, "allocs": 1e-5, "reads": 1e-4, "writebacks": 5e-5, "drops": 1e-5}
    two = {k: 3 * v for k, v in one.items()}
    disk = replace(DISK, worker_costs=two, worker_costs_by_workers={"1": one, "2": two})
    assert disk.costs_for(1) is one and disk.costs_for(2) is two and disk.costs_for(3) is two
    assert replace(DISK, worker_costs=two).costs_for(1) is two
    d = 1e-3
    run = {"durations": np.full((1, 2), d), "warmup": False, "throttle": None}
    plain = simulate_memory_limited(two_axpys(), cpu_machine(1), 3 * S, DISK, "eager", **run)
    ev = plain.task_events
    for disk_, costs in ((disk, one), (replace(DISK, worker_costs=two), two)):
        charged = simulate_memory_limited(two_axpys(), cpu_machine(1), 3 * S, disk_, "eager", **run)
        extra = sum(costs.get(k, 0.0) * float(np.sum(ev[k])) for k in EVENTS) + 2 * costs["per_task"]
        assert charged.makespan == pytest.approx(plain.makespan + extra, rel=1e-12)


def test_costs_per_worker_count_are_stored_kept_and_described(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECAST_HOME", str(tmp_path / "home"))
    machine = cpu_machine(2)
    one, two = {"per_task": 1e-5, "reads": 1e-4}, {"per_task": 3e-5, "reads": 3e-4}
    path = save_disk(machine, replace(DISK, worker_costs=two, worker_costs_by_workers={"1": one, "2": two}))
    assert load_disk(path).costs_for(1) == one
    again, _ = measure_and_store(machine, str(tmp_path), total_bytes=1 << 20, repeats=1)
    assert again.worker_costs_by_workers == {"1": one, "2": two}
    assert "30 us per task, 300 us per tile read back (on 1 worker: 10 us per task, 100 us per tile read back)" \
        in again.describe()


def test_calibrate_fits_the_costs_on_one_worker_and_on_two(tmp_path, monkeypatch, capsys):
    """``calibrate --offload-dir`` on two cores runs the probes on one worker and on two and stores each
    count's costs (the probes themselves: test_calibrate_fits_starpu_costs_on_a_probe_step)."""
    from tilecast.api import calibration
    from tilecast.loop import disk_fit, kernel_calibration

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path / "home"))
    machine = cpu_machine(2)
    ran = []

    def fake_fit(machine_, disk, directory, probes, workers, progress=None, offload_io="buffered"):
        ran.append((workers, offload_io))
        progress(0, 1, "probe")
        row = {"probe": "probe", "measured_step_s": 1.0, "base_step_s": 0.5, "predicted_step_s": 1.0, "error": 0.0}
        return replace(disk, worker_costs={"reads": 1e-4 * workers},
                       worker_costs_source=f"fitted on {workers} workers"), [row]

    monkeypatch.setattr(disk_fit, "calibrate_worker_costs", fake_fit)
    monkeypatch.setattr(kernel_calibration, "starpu_workers", lambda m: 2)
    monkeypatch.setattr(calibration, "_io_cpu", lambda machine_, disk, *a: (disk, ""))
    disk, path, rows = calibration._disk(machine, str(tmp_path), fit=True, progress=True)
    assert [r[:2] for r in ran] == [(1, "buffered"), (2, "buffered")] and [r["workers"] for r in rows] == [1, 2]
    assert disk.worker_costs == {"reads": 2e-4} and disk.costs_for(1) == {"reads": 1e-4}
    assert load_disk(path) == disk and "1 workers" in disk.worker_costs_source and disk.direct_costs == {}
    assert "under a memory limit on 1 worker (probe)" in capsys.readouterr().err
    if not disk.has_device:  # a file system without O_DIRECT: the direct probes are not run
        return
    ran.clear()
    disk, path, rows = calibration._disk(machine, str(tmp_path), fit=True, progress=True, offload_io="direct")
    # the same probes again, their files written direct
    assert [r[:2] for r in ran] == [(1, "buffered"), (2, "buffered"), (1, "direct"), (2, "direct")]
    assert [r.get("offload_io") for r in rows] == [None, None, "direct", "direct"]
    assert disk.direct_costs["worker_costs_by_workers"] == {"1": {"reads": 1e-4}, "2": {"reads": 2e-4}}
    assert load_disk(path).direct().costs_for(1) == {"reads": 1e-4} and disk.worker_costs == {"reads": 2e-4}
    assert "on 1 worker, O_DIRECT (probe)" in capsys.readouterr().err


def test_the_typical_tile_is_the_byte_weighted_median():
    """Many small tiles and a few large ones: half the bytes are in the large ones, so the typical tile is
    theirs; none, or tiles of no bytes, give 0."""
    from tilecast.perfmodel.disk_node import typical_tile_bytes

    assert typical_tile_bytes([16] * 100 + [4096] * 3) == 4096
    assert typical_tile_bytes([16] * 1000 + [4096] * 3) == 16
    assert typical_tile_bytes([]) == 0 and typical_tile_bytes([0, 0]) == 0


def test_a_probe_at_the_tile_size_is_made_only_for_tiles_much_larger_than_the_probes():
    """No probe for tiles within TILE_PROBE_RATIO of the standard probes' largest (64 x 64 floats); for 256 KiB
    tiles a one-layer model whose own typical tile is 256 KiB, under a limit of TILE_PROBE_TILES of them."""
    from tilecast.loop.disk_fit import TILE_PROBE_RATIO, TILE_PROBE_TILES, tile_probe
    from tilecast.perfmodel.disk_node import typical_tile_bytes

    assert tile_probe(TILE_PROBE_RATIO * 64 * 64 * 4 - 1) is None
    model, batch, seq, tile, limit = tile_probe(256 * 256 * 4)
    graph = build_step(load_model(model), batch, seq, Tiling.parse(tile))
    assert typical_tile_bytes(graph.tile_nbytes) == 256 * 256 * 4 and limit == TILE_PROBE_TILES * 256 * 256 * 4
    assert load_model(model).n_layer == 1 and int(tile) == seq == 256
    assert tile_probe(300 * 300 * 4)[3] == "288"  # the side rounded to a multiple of 32


def test_a_step_is_charged_the_costs_fitted_at_its_own_tile_size():
    """Costs fitted on a probe of the step's tiles replace the standard probes' for the worker counts they were
    fitted on, for steps whose typical tile is within a factor of two of the probe's; the simulator passes the
    step's typical tile."""
    small = {"per_task": 1e-5, "reads": 1e-5}
    large = {"per_task": 1e-5, "reads": 4e-4}
    disk = replace(DISK, worker_costs=small, worker_costs_by_workers={"1": small, "2": small},
                   tile_costs={"tile_bytes": S, "by_workers": {"1": large}})
    assert disk.costs_for(1, S) is large and disk.costs_for(1, 2 * S) is large and disk.costs_for(1, S // 2) is large
    assert disk.costs_for(1, 3 * S) is small and disk.costs_for(1) is small and disk.costs_for(2, S) is small
    d = 1e-3
    run = {"durations": np.full((1, 2), d), "warmup": False, "throttle": None}
    plain = simulate_memory_limited(two_axpys(), cpu_machine(1), 3 * S, DISK, "eager", **run)
    charged = simulate_memory_limited(two_axpys(), cpu_machine(1), 3 * S, disk, "eager", **run)
    extra = sum(large.get(k, 0.0) * float(np.sum(plain.task_events[k])) for k in EVENTS) + 2 * large["per_task"]
    assert np.sum(plain.task_events["reads"]) > 0
    assert charged.makespan == pytest.approx(plain.makespan + extra, rel=1e-12)


def test_costs_at_a_tile_size_are_stored_kept_and_described(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECAST_HOME", str(tmp_path / "home"))
    machine = cpu_machine(2)
    tile_costs = {"tile_bytes": 262144, "by_workers": {"1": {"per_task": 1e-5, "reads": 1.5e-4}}, "source": "probe"}
    path = save_disk(machine, replace(DISK, worker_costs={"reads": 1e-5}, tile_costs=tile_costs))
    assert load_disk(path).costs_for(1, 262144) == tile_costs["by_workers"]["1"]
    again, _ = measure_and_store(machine, str(tmp_path), total_bytes=1 << 20, repeats=1)
    assert again.tile_costs == tile_costs
    assert "at tiles of 256 KiB: on 1 worker: 10 us per task, 150 us per tile read back" in again.describe()


def test_calibrate_runs_a_probe_at_the_configurations_tile_size_when_its_tiles_are_large(tmp_path, monkeypatch,
                                                                                         capsys):
    """``calibrate --offload-dir`` of a configuration of 256 KiB tiles runs the probe of that size on one worker
    and on two, after the standard probes, and stores its costs; one of 16 KiB tiles runs none."""
    from tilecast.api import calibration
    from tilecast.loop import disk_fit, kernel_calibration

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path / "home"))
    machine = cpu_machine(2)
    probed = []

    def fake_fit(machine_, disk, directory, probes, workers, progress=None, offload_io="buffered"):
        return replace(disk, worker_costs={"reads": 1e-5, "per_task": 1e-6 * workers}), []

    def fake_tile(machine_, disk, directory, probe, counts, progress=None, offload_io="buffered", per_task=None):
        probed.append((probe, list(counts)))
        assert per_task == {str(w): 1e-6 * w for w in counts}  # the standard probes' cost per task, kept
        progress(0, len(counts), counts[0], "tile probe")
        return {"tile_bytes": 262144, "by_workers": {str(w): {"reads": 1e-4 * w} for w in counts}}, [
            {"probe": "tile probe", "measured_step_s": 1.0, "base_step_s": 0.5, "predicted_step_s": 1.0, "error": 0.0,
             "workers": w} for w in counts]

    monkeypatch.setattr(disk_fit, "calibrate_worker_costs", fake_fit)
    monkeypatch.setattr(disk_fit, "calibrate_tile_costs", fake_tile)
    monkeypatch.setattr(kernel_calibration, "starpu_workers", lambda m: 2)
    monkeypatch.setattr(calibration, "_io_cpu", lambda machine_, disk, *a: (disk, ""))
    disk, path, rows = calibration._disk(machine, str(tmp_path), fit=True, progress=True, tile_bytes=16384)
    assert probed == [] and disk.tile_costs == {}
    disk, path, rows = calibration._disk(machine, str(tmp_path), fit=True, progress=True, tile_bytes=262144)
    assert probed == [(disk_fit.tile_probe(262144), [1, 2])] and [r["workers"] for r in rows] == [1, 2]
    assert load_disk(path).costs_for(1, 262144) == {"reads": 1e-4}
    assert "probe at the configuration's tile size 1/2 on 1 worker (tile probe)" in capsys.readouterr().err


def test_a_given_cost_per_task_is_kept_and_the_events_fitted_around_it():
    """In a probe whose every task allocates, a cost per task and a cost per tile allocated stand for one another
    (only their sum is fitted); with the cost per task given, the allocation's is what remains."""
    from types import SimpleNamespace

    from tilecast.loop.disk_fit import PROBE_EVENTS, probe_weights

    rng = np.random.default_rng(1)
    n = 400
    events = {k: np.zeros(n, int) for k in EVENTS}
    events["allocs"][:] = 1
    events["reads"] = rng.integers(0, 2, n)
    sim = rng.uniform(0, 1e-4, n)
    real = sim + 20e-6 + 150e-6 * events["allocs"] + 250e-6 * events["reads"]
    run = SimpleNamespace(events=events, sim_delays=sim, real_delays=[real, real])
    got = probe_weights([run], PROBE_EVENTS, per_task=20e-6)
    assert got["per_task"] == 20e-6
    assert got["allocs"] == pytest.approx(150e-6, abs=1e-9) and got["reads"] == pytest.approx(250e-6, abs=1e-9)
    joint = probe_weights([run], PROBE_EVENTS)
    assert joint["per_task"] + joint["allocs"] == pytest.approx(170e-6, abs=1e-9)
    assert joint["reads"] == pytest.approx(250e-6, abs=1e-9)


def test_the_costs_at_a_tile_size_are_fitted_on_that_probe_alone(tmp_path, monkeypatch):
    """calibrate_tile_costs runs its one probe on StarPU with a real disk node on each worker count asked and
    fits each count's costs on it alone: non-negative, some positive, the tile size the probe's own."""
    from tilecast.loop.disk_fit import calibrate_tile_costs
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.disk_node import measure_disk, typical_tile_bytes

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path / "home"))
    offload = tmp_path / "offload"
    offload.mkdir()
    machine = load_machine("local")
    disk = measure_disk(str(offload), total_bytes=1 << 20, repeats=1)
    probe = ("gpt2-tiny", 1, 64, "32", 2 << 20)
    costs, rows = calibrate_tile_costs(machine, disk, str(offload), probe, [1])
    graph = build_step(load_model("gpt2-tiny"), 1, 64, Tiling.parse("32"))
    assert costs["tile_bytes"] == typical_tile_bytes(graph.tile_nbytes) > 0
    c = costs["by_workers"]["1"]
    assert set(costs["by_workers"]) == {"1"} and min(c.values()) >= 0 and max(c.values()) > 0
    assert [r["workers"] for r in rows] == [1] and "gpt2-tiny" in costs["source"]
