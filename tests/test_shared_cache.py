"""The shared last-level cache between a core's level-2 cache and main memory.

A tile evicted from the core's cache but touched within the shared cache's share per core comes back from that
cache (the *near* lane time, calibrated in small graphs), not from main memory (the cold lane time): sysfs gives
the share, the graph gives each byte's reuse distance (a first access counting from the step before), the
calibration stores the near lane, and every simulation loop (general, fused, C) computes the same durations.
"""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_graphs import random_graph
from test_sim_fused import FUSED, TILE, assert_same_outcome, cases
from test_worker_cache import _run

from tilecast.graph import Tiling
from tilecast.graph.builder import GraphBuilder
from tilecast.graph.gpt2 import build_gpt2_step
from tilecast.graph.model_config import load_model
from tilecast.perfmodel.cache_size import llc_per_core
from tilecast.perfmodel.reuse import cold_fraction, far_fraction, step_bytes
from tilecast.perfmodel.shapes import graph_shapes
from tilecast.perfmodel.task_lanes import TaskLanes, attach, lanes_of
from tilecast.simulator import native
from tilecast.simulator.simulate import POLICIES
from tilecast.simulator.worker_cache import WorkerCache


def _sysfs(root, caches):
    for i, (level, kind, size, cpus) in enumerate(caches):
        d = root / f"index{i}"
        d.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", cpus)):
            (d / name).write_text(f"{value}\n")
    return str(root)


def test_the_shared_cache_share_per_core_comes_from_sysfs(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    three = _sysfs(tmp_path / "a", [(1, "Data", "48K", "0"), (2, "Unified", "2048K", "0"),
                                    (3, "Unified", "491520K", "0-1")])
    size, source = llc_per_core(three)
    assert size == 491520 * 1024 // 2 and "level 3" in source and "shared by 2 CPUs" in source
    two = _sysfs(tmp_path / "b", [(1, "Data", "32K", "0"), (2, "Unified", "1024K", "0-3")])
    assert llc_per_core(two)[0] == 0  # no level beyond the core's level-2 cache
    assert llc_per_core(str(tmp_path / "missing"))[0] == 0


def _two_tiles(repeats=4):
    b = GraphBuilder(Tiling.uniform(TILE))
    t = b.tensor("x", (2 * TILE, TILE), ("seq", None), "param")
    a, c = t.tile_ids(0, 0), t.tile_ids(1, 0)
    for _ in range(repeats):
        b.add("axpy", [a, c], dict(n=TILE * TILE, alpha=0.5))  # reads a, writes c
    return b.build()


def test_a_first_access_counts_from_the_step_before():
    g = _two_tiles()
    step = step_bytes(g)
    assert step == 4 * 2 * TILE * TILE * 4
    assert far_fraction(g, 1.0, step - 1.0)[0] == 1.0 and far_fraction(g, 1.0, float(step))[0] == 0.0
    # later accesses: their distance is one task's bytes, within a share of the step's size
    assert (far_fraction(g, 1.0, float(step))[1:] == 0.0).all() and (cold_fraction(g, 1.0)[1:] == 1.0).all()
    # nothing hot in the core's cache is far, whatever the share
    assert (far_fraction(g, float(step), 1.0)[1:] == 0.0).all() and far_fraction(g, float(step), 1.0)[0] == 1.0
    with pytest.raises(ValueError, match="llc_bytes"):
        far_fraction(g, 1.0, 0.0)


def _lanes(n, cache, llc, near_delta=0.25):
    one = np.ones((1, n))
    return TaskLanes(one, one, (cache,), np.zeros((1, n)), near_delta * one, np.zeros((1, n)), (llc,))


def test_a_tile_last_touched_on_another_worker_comes_from_the_shared_cache():
    g = _two_tiles()
    n = g.n_tasks
    wc = WorkerCache(_lanes(n, 1e9, 1e9), g, [0, 0])
    assert wc.duration(0, 0) == 1.25  # first touch: the step before, within the shared cache
    assert wc.duration(1, 1) == 1.25  # both tiles last touched by worker 0: near, not cold
    assert wc.duration(2, 0) == 1.25
    assert wc.duration(3, 0) == 1.0  # worker 0 again, within its own cache
    small = WorkerCache(_lanes(n, 1e9, 1.0), g, [0, 0])  # a share smaller than any distance: all far
    assert [small.duration(t, w) for t, w in ((0, 0), (1, 1), (2, 0), (3, 0))] == [2.0, 2.0, 2.0, 1.0]
    none = WorkerCache(TaskLanes(np.ones((1, n)), np.ones((1, n)), (1e9,), np.zeros((1, n))), g, [0, 0])
    assert [none.duration(t, w) for t, w in ((0, 0), (1, 1), (2, 0), (3, 0))] == [2.0, 2.0, 2.0, 1.0]


def test_what_all_workers_accessed_since_counts_against_the_shared_cache():
    g = _two_tiles(repeats=3)
    per_task = 2 * TILE * TILE * 4
    wc = WorkerCache(_lanes(g.n_tasks, 1.0, float(per_task)), g, [0, 0])  # no level-2 cache to speak of
    wc.duration(0, 0)
    wc.duration(1, 1)  # tile distance: one task's bytes (worker 0's), within the share
    assert wc.duration(2, 0) == 1.25  # again one task's bytes since, worker 1's: near
    tight = WorkerCache(_lanes(g.n_tasks, 1.0, per_task - 1.0), g, [0, 0])
    assert [tight.duration(t, w) for t, w in ((0, 0), (1, 1), (2, 0))] == [2.0, 2.0, 2.0]


@st.composite
def shared_cases(draw):
    graph, machine, durations, sched, transfers = draw(cases(POLICIES))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    unit = TILE * TILE * 4
    cache = float(draw(st.sampled_from([1, 3, 6])) * unit)
    llc = float(draw(st.sampled_from([2, 8, 30, 1000])) * unit)
    hot = np.array(durations, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        delta = np.where(np.isfinite(hot), hot * rng.integers(0, 5, size=hot.shape) / 4, 0.0)
        near = np.where(np.isfinite(hot), delta * rng.random(hot.shape), 0.0)
    fraction = rng.random(hot.shape)
    lanes = TaskLanes(hot, delta, tuple(cache for _ in range(hot.shape[0])), fraction, near,
                      fraction * rng.random(hot.shape), tuple(llc for _ in range(hot.shape[0])))
    d = lanes.static_durations()
    attach(d, lanes)
    return graph, machine, d, sched, transfers


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_cases())
def test_every_loop_computes_the_same_durations_with_a_shared_cache(case):
    graph, machine, d, sched, transfers = case
    assert lanes_of(d) is not None
    general = _run(graph, machine, d, sched, transfers, fused=False)
    if native.library() is not None:
        assert_same_outcome(general, _run(graph, machine, d, sched, transfers, fused=False, native_loop=True))
    if sched in FUSED:
        assert_same_outcome(general, _run(graph, machine, d, sched, transfers, fused=True))


def _calibration(graph, machine, near=True, llc=200e6):
    from tilecast.kernels import all_kernels
    from tilecast.perfmodel.calibration import STARPU_TASKS, Calibration

    cal = Calibration(machine.name, machine.fingerprint(), machine.kind_names[0], STARPU_TASKS)
    for ks in graph_shapes(graph):
        name = all_kernels()[ks.kernel].name
        for j, shape in enumerate(ks.shapes):
            cal.add(name, shape, 3e-5 + 1e-6 * j, 0.0, STARPU_TASKS)
            cal.add_hot(name, shape, 1e-5 + 1e-6 * j)
            if near and name != "adamw":  # one kernel without a near time
                cal.add_near(name, shape, 1.5e-5 + 1e-6 * j)
    cal.cache_bytes, cal.llc_bytes = 256e3, llc
    return cal


def test_the_duration_model_takes_the_near_figure_within_the_shared_cache():
    from sim_machines import cpu_machine

    from tilecast.kernels import all_kernels
    from tilecast.perfmodel.kernel_model import DurationModel

    g = build_gpt2_step(load_model("gpt2-tiny"), 1, 32, Tiling.uniform(32))
    m = cpu_machine(2)
    two = DurationModel(m, _calibration(g, m)).durations(g)
    lanes = lanes_of(two)
    assert lanes is not None and lanes.far is not None and lanes.llc_bytes == (200e6,)
    np.testing.assert_array_equal(lanes.static_durations(), two)
    adamw = g.kernel == [k.name for k in all_kernels()].index("adamw")
    np.testing.assert_array_equal(lanes.near_delta[:, adamw], lanes.delta[:, adamw])  # no near time: cold
    assert (lanes.near_delta[:, ~adamw] < lanes.delta[:, ~adamw]).all()
    one = DurationModel(m, _calibration(g, m, llc=0.0)).durations(g)  # no shared cache: hot to cold
    assert lanes_of(one).far is None
    # the whole step fits the shared cache: every byte not hot is near, so the step is shorter
    assert (two <= one).all() and two[:, ~adamw].sum() < one[:, ~adamw].sum()
    np.testing.assert_array_equal(two[:, adamw], one[:, adamw])
    tiny = DurationModel(m, _calibration(g, m, llc=1.0)).durations(g)  # a share smaller than any distance
    np.testing.assert_allclose(tiny, one, rtol=1e-12)


def test_the_near_lane_is_stored_and_checked(tmp_path):
    from sim_machines import cpu_machine

    from tilecast.perfmodel.calibration import CALIBRATION_FORMAT, Calibration, CalibrationError

    g = build_gpt2_step(load_model("gpt2-tiny"), 1, 32, Tiling.uniform(32))
    m = cpu_machine(2)
    cal = _calibration(g, m)
    cal.llc_source = "detected: test"
    path = cal.save(str(tmp_path / "c.json"))
    back = Calibration.load(path)
    assert back.near == cal.near and back.llc_bytes == 200e6 and back.llc_source == "detected: test"
    assert back.calibrated_only().near == cal.near and back.calibrated_only().llc_bytes == 200e6
    name = next(iter(cal.near))
    shapes, near = back.arrays(name, lane="near")
    _, cold = back.arrays(name)
    assert len(near) == len(cal.near[name]["shapes"]) and (near < cold).all()
    with pytest.raises(ValueError, match="lane"):
        back.arrays(name, lane="warm")
    doc = json.loads(open(path).read())
    doc["near"][name]["median_s"][0] = -1.0
    open(path, "w").write(json.dumps(doc))
    with pytest.raises(CalibrationError, match=f"field near.{name}"):
        Calibration.load(path)
    doc["near"][name]["median_s"][0] = 1e-5
    doc["llc_bytes"] = "lots"
    open(path, "w").write(json.dumps(doc))
    with pytest.raises(CalibrationError, match="field llc_bytes"):
        Calibration.load(path)
    doc["llc_bytes"], doc["format"] = 1e6, CALIBRATION_FORMAT - 1
    open(path, "w").write(json.dumps(doc))
    with pytest.raises(CalibrationError, match="calibrate` again"):
        Calibration.load(path)


def test_learning_from_a_trace_keeps_the_lane_times_and_caches():
    """A run's trace teaches in-step durations of its own shapes; the near lane, the caches' sizes and every
    other shape's lane times stay, so that a shape the run did not have is predicted as before."""
    from sim_machines import cpu_machine

    from tilecast.perfmodel.from_trace import calibration_from_trace
    from tilecast.perfmodel.kernel_model import DurationModel
    from tilecast.trace import make_trace

    other = build_gpt2_step(load_model("gpt2-tiny"), 1, 32, Tiling.uniform(32))
    ran = build_gpt2_step(load_model("gpt2-tiny"), 1, 32, Tiling.uniform(16))
    m = cpu_machine(2)
    base = _calibration(other, m)
    base.add_all(_calibration(ran, m))
    base.quiet = {"passes": 3}
    seconds = np.full(ran.n_tasks, 2e-5)
    start = np.cumsum(np.concatenate(([0.0], seconds[:-1])))
    trace = make_trace(task=np.arange(ran.n_tasks), kernel="gemm", worker=0, node=0, start_s=start,
                       end_s=start + seconds, bytes=0, flops=0.0, source="real", tag="")
    learned = calibration_from_trace(ran, trace, m, base=base, workers=2)
    assert learned.near == base.near and learned.hot == base.hot
    assert (learned.llc_bytes, learned.cache_bytes, learned.quiet) == (base.llc_bytes, base.cache_bytes, base.quiet)
    assert learned.calibrated_only().near == base.near
    # the shapes of the run take its in-step figure; the other graph's shapes that the run did not have keep
    # their durations
    np.testing.assert_allclose(DurationModel(m, learned).durations(ran), 2e-5)
    seen = {(ks.kernel, tuple(s)) for ks in graph_shapes(ran) for s in ks.shapes.tolist()}
    kept = np.zeros(other.n_tasks, dtype=bool)
    for ks in graph_shapes(other):
        for row, s in enumerate(ks.shapes.tolist()):
            kept[ks.tasks[ks.inverse == row]] = (ks.kernel, tuple(s)) not in seen
    assert kept.sum() > other.n_tasks // 2
    before, after = DurationModel(m, base).durations(other), DurationModel(m, learned).durations(other)
    np.testing.assert_array_equal(after[:, kept], before[:, kept])
