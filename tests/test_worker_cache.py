"""Per-worker cache state in the simulator: the cold share of a task's bytes from the worker that starts it.

The rule (tilecast/simulator/worker_cache.py): a tile is hot for worker w when w touched it last and has
accessed at most its cache's bytes since. One worker running the tasks in submission order gives the
graph-order share of tilecast.perfmodel.reuse exactly; every loop (general, fused, C) computes the same
durations bit for bit; the durations a DurationModel returns carry their lanes, and only those.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_graphs import random_graph
from test_sim_fused import FUSED, TILE, _outcome, assert_same_outcome, cases

from tilecast.graph import Tiling
from tilecast.graph.builder import GraphBuilder
from tilecast.graph.gpt2 import build_gpt2_step
from tilecast.graph.model_config import load_model
from tilecast.perfmodel.reuse import cold_fraction
from tilecast.perfmodel.task_lanes import TaskLanes, attach, lanes_of
from tilecast.simulator import native
from tilecast.simulator.engine import Engine
from tilecast.simulator.simulate import POLICIES, simulate
from tilecast.simulator.worker_cache import WorkerCache


def _lanes(durations, rng, cache_bytes):
    """Lanes whose graph-order durations are ``durations``' shape: hot = durations, cold up to 2x; a tenth of the
    tasks with one figure (delta 0), and where a kind cannot run a task (inf), delta 0."""
    hot = np.array(durations, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        delta = np.where(np.isfinite(hot), hot * rng.integers(0, 5, size=hot.shape) / 4, 0.0)
    delta[:, rng.random(hot.shape[1]) < 0.1] = 0.0
    return TaskLanes(hot, delta, tuple(cache_bytes for _ in range(hot.shape[0])),
                     rng.random(hot.shape))


def _with_lanes(graph, durations, rng, cache_bytes):
    lanes = _lanes(durations, rng, cache_bytes)
    d = lanes.static_durations()
    attach(d, lanes)
    return d, lanes


@pytest.mark.parametrize("cache", [1.0, 4096.0 * 3, 4096.0 * 5 - 1, 60_000.0, 1e12])
def test_one_worker_in_submission_order_is_the_graph_order_share(cache):
    for g in (random_graph(np.random.default_rng(1), 300, 12, TILE),
              build_gpt2_step(load_model("gpt2-tiny"), 1, 48, Tiling.parse("seq=32,embd=48"))):  # ragged tiles
        n = g.n_tasks
        wc = WorkerCache(TaskLanes(np.zeros((1, n)), np.zeros((1, n)), (cache,), np.zeros((1, n))), g, [0])
        got = np.array([wc.cold_share(t, 0) for t in range(n)])
        np.testing.assert_array_equal(got, cold_fraction(g, cache))


def test_a_tile_last_touched_on_another_worker_is_cold():
    b = GraphBuilder(Tiling.uniform(TILE))
    t = b.tensor("x", (2 * TILE, TILE), ("seq", None), "param")
    a, c = t.tile_ids(0, 0), t.tile_ids(1, 0)
    for _ in range(4):
        b.add("axpy", [a, c], dict(n=TILE * TILE, alpha=0.5))  # reads a, writes c
    g = b.build()
    n = g.n_tasks
    wc = WorkerCache(TaskLanes(np.ones((1, n)), np.ones((1, n)), (1e9,), np.zeros((1, n))), g, [0, 0])
    assert wc.cold_share(0, 0) == 1.0  # first touch
    assert wc.cold_share(1, 1) == 1.0  # both tiles last touched by worker 0
    assert wc.cold_share(2, 0) == 1.0  # ... and now by worker 1
    assert wc.cold_share(3, 0) == 0.0  # worker 0 again, well within its cache
    assert wc.duration(3, 0) == 1.0 and WorkerCache(
        TaskLanes(np.ones((1, n)), np.ones((1, n)), (1e9,), np.zeros((1, n))), g, [0]).duration(0, 0) == 2.0


def test_what_a_worker_accessed_since_counts_against_its_cache():
    g = random_graph(np.random.default_rng(2), 1, 3, TILE)  # one task of 2 or 3 distinct tiles
    nbytes = int(g.tile_nbytes[g.acc_tile].sum())
    z = np.zeros((1, 1))
    small = WorkerCache(TaskLanes(z, z, (nbytes - 1.0,), z), g, [0])
    large = WorkerCache(TaskLanes(z, z, (float(nbytes),), z), g, [0])
    for wc in (small, large):
        wc.cold_share(0, 0)
    # the same task again: each tile's distance is the task's bytes (every access since, its own included)
    assert small.cold_share(0, 0) == 1.0 and large.cold_share(0, 0) == 0.0


def _run(graph, machine, d, sched, transfers, fused, native_loop=False, worker_cache=True):
    Engine.worker_cache = worker_cache
    try:
        return _outcome(graph, machine, d, sched, transfers, fused=fused, native=native_loop)
    finally:
        Engine.worker_cache = True


@st.composite
def lane_cases(draw):
    graph, machine, durations, sched, transfers = draw(cases(POLICIES))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    cache = float(draw(st.sampled_from([1, 3, 6, 40])) * TILE * TILE * 4)
    d, _ = _with_lanes(graph, durations, rng, cache)
    return graph, machine, d, sched, transfers


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lane_cases())
def test_every_loop_computes_the_same_durations(case):
    graph, machine, d, sched, transfers = case
    general = _run(graph, machine, d, sched, transfers, fused=False)
    if native.library() is not None:
        assert_same_outcome(general, _run(graph, machine, d, sched, transfers, fused=False, native_loop=True))
    if sched in FUSED:
        assert_same_outcome(general, _run(graph, machine, d, sched, transfers, fused=True))


@pytest.mark.parametrize("sched", list(POLICIES))
def test_each_task_takes_what_its_workers_cache_says(sched, monkeypatch):
    """On a few thousand tasks: each task's simulated duration is hot + f * delta with f replayed, by a fresh
    WorkerCache, over the tasks in the order the loop started them (equal start times leave that order to the
    loop: it is read from the general loop); switched off, the graph-order durations."""
    from sim_machines import cpu_machine

    g = random_graph(np.random.default_rng(7), 2000, 40, TILE)
    m = cpu_machine(2)
    rng = np.random.default_rng(8)
    d, lanes = _with_lanes(g, 1e-6 + rng.random((len(m.kind_names), g.n_tasks)) * 1e-4, rng, 6.0 * TILE * TILE * 4)
    r = simulate(g, m, sched, durations=d)  # the C loop where it is built
    started = []
    seen = WorkerCache.duration
    monkeypatch.setattr(WorkerCache, "duration", lambda self, t, w: started.append(t) or seen(self, t, w))
    monkeypatch.setattr(Engine, "native_loop", False)
    monkeypatch.setattr(Engine, "fused_loops", False)
    general = simulate(g, m, sched, durations=d)
    monkeypatch.undo()
    np.testing.assert_array_equal(general.end, r.end)
    assert sorted(started) == list(range(g.n_tasks))
    replay = WorkerCache(lanes, g, [0, 0])
    want = np.array([replay.duration(t, r.worker[t]) for t in started])
    np.testing.assert_allclose(r.end[started] - r.start[started], want, rtol=1e-9, atol=1e-15)
    assert not np.allclose(want, d[0][started])  # the per-worker shares differ from the graph order's
    Engine.worker_cache = False
    try:
        off = simulate(g, m, sched, durations=d)
    finally:
        Engine.worker_cache = True
    np.testing.assert_allclose(off.end - off.start, d[0], rtol=1e-9, atol=1e-15)


def test_lanes_are_given_back_for_the_very_durations_only():
    rng = np.random.default_rng(3)
    d, lanes = _with_lanes(None, rng.random((1, 50)), rng, 1e6)
    assert lanes_of(d) is lanes
    assert lanes_of(d.copy()) is None  # another array
    scaled = d
    scaled *= 1.5  # edited in place: no longer the lanes' durations
    assert lanes_of(scaled) is None


def test_the_duration_model_attaches_its_lanes():
    from tilecast.perfmodel.calibration import STARPU_TASKS, Calibration
    from tilecast.perfmodel.kernel_model import DurationModel
    from tilecast.perfmodel.shapes import graph_shapes
    from tilecast.kernels import all_kernels
    from sim_machines import cpu_machine

    g = build_gpt2_step(load_model("gpt2-tiny"), 1, 32, Tiling.uniform(32))
    m = cpu_machine(2)
    cal = Calibration(m.name, m.fingerprint(), m.kind_names[0], STARPU_TASKS)
    for ks in graph_shapes(g):
        name = all_kernels()[ks.kernel].name
        for j, shape in enumerate(ks.shapes):
            cal.add(name, shape, 2e-5 + 1e-6 * j, 0.0, STARPU_TASKS)
            if name != "adamw":  # one kernel with cold figures only
                cal.add_hot(name, shape, 1e-5 + 1e-6 * j)
    model = DurationModel(m, cal)
    d = model.durations(g)
    lanes = lanes_of(d)
    assert lanes is not None and lanes.hot.shape == d.shape
    np.testing.assert_array_equal(lanes.static_durations(), d)
    adamw = g.kernel == [k.name for k in all_kernels()].index("adamw")
    assert (lanes.delta[:, adamw] == 0).all() and (lanes.delta[:, ~adamw] > 0).all()
    assert lanes.cache_bytes == (model.cache_bytes(m.kind_names[0]),)


@pytest.mark.parametrize("sched", list(POLICIES))
def test_cache_state_and_costs_between_tasks_together(sched):
    """Both per-task charges at once (the runtime's cost between tasks and the cold share from the worker's
    cache): every loop alike, and the step longer with the costs than without."""
    from sim_machines import two_device_machine

    g = random_graph(np.random.default_rng(11), 1200, 30, TILE)
    m = two_device_machine(capacity_gib=64 * TILE * TILE * 4 / 2**30, n_devices=2, workers_per_device=2)
    rng = np.random.default_rng(12)
    d, _ = _with_lanes(g, rng.integers(1, 50, size=(len(m.kind_names), g.n_tasks)) * 1e-6, rng,
                       6.0 * TILE * TILE * 4)
    gapped = m.with_gap_costs(2e-6, 5e-7, 1.5e-6, 2.5e-6)
    general = _run(g, gapped, d, sched, True, fused=False)
    assert not isinstance(general, str), general
    if native.library() is not None:
        assert_same_outcome(general, _run(g, gapped, d, sched, True, fused=False, native_loop=True))
    if sched in FUSED:
        assert_same_outcome(general, _run(g, gapped, d, sched, True, fused=True))
    assert simulate(g, gapped, sched, durations=d).makespan > simulate(g, m, sched, durations=d).makespan
