"""Property tests of the simulator on random graphs and machines (hypothesis)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_graphs import random_graph
from sim_machines import cpu_machine, two_device_machine

from tilecast.simulator.simulate import POLICIES, simulate

TILE = 32
TILE_BYTES = TILE * TILE * 4


@st.composite
def cases(draw):
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    n_tasks = draw(st.integers(1, 40))
    n_tiles = draw(st.integers(3, 10))
    graph = random_graph(rng, n_tasks, n_tiles, TILE)
    if draw(st.booleans()):
        machine = cpu_machine(draw(st.integers(1, 4)), overhead_us=draw(st.sampled_from([0.0, 5.0])))
    else:
        tiles_fit = draw(st.integers(3, 12))  # small enough to force evictions, large enough for one task
        machine = two_device_machine(capacity_gib=tiles_fit * TILE_BYTES / 2**30,
                                     bw_gbps=draw(st.sampled_from([0.1, 1.0, 10.0])),
                                     n_devices=draw(st.integers(1, 3)),
                                     overhead_us=draw(st.sampled_from([0.0, 5.0])),
                                     host_workers=draw(st.integers(0, 2)))
    kinds = len(machine.kind_names)
    durations = rng.uniform(1e-6, 1e-4, size=(kinds, graph.n_tasks))
    sched = draw(st.sampled_from(list(POLICIES)))
    return graph, machine, durations, sched


FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(cases())
def test_schedule_is_valid_and_above_the_lower_bounds(case):
    graph, machine, durations, sched = case
    r = simulate(graph, machine, sched, durations=durations)
    s = r.summary
    eps = 1e-12
    assert s["makespan_s"] >= s["critical_path_s"] - eps
    assert s["makespan_s"] >= s["work_bound_s"] - eps
    # every task ran once, for its kind's duration, after its predecessors
    kind_index = {k: i for i, k in enumerate(machine.kind_names)}
    kinds = np.array([kind_index[w.kind] for w in machine.workers])[r.worker]
    np.testing.assert_allclose(r.end - r.start, durations[kinds, np.arange(graph.n_tasks)], rtol=1e-9)
    ptr, pred = graph.dependencies
    owner = np.repeat(np.arange(graph.n_tasks), np.diff(ptr))
    assert np.all(r.start[owner] >= r.end[pred] - eps)
    # a worker runs one task at a time, paying the overhead before each
    for w in range(len(machine.workers)):
        ids = np.flatnonzero(r.worker == w)
        ids = ids[np.argsort(r.start[ids])]
        assert np.all(r.start[ids[1:]] >= r.end[ids[:-1]] + machine.task_overhead - eps)
    # no device memory node ever held more than its capacity
    for node in machine.nodes[1:]:
        assert s["peak_memory_bytes"][node.name] <= node.capacity
    # a transfer starts after it is issued and links carry what the log says
    assert sum(s["bytes_per_link"].values()) >= s["bytes_moved"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_same_inputs_give_the_same_trace(case):
    graph, machine, durations, sched = case
    a = simulate(graph, machine, sched, durations=durations).trace()
    b = simulate(graph, machine, sched, durations=durations).trace()
    assert a.equals(b)


@pytest.mark.parametrize("sched", list(POLICIES))
def test_more_workers_never_break_the_bounds_on_a_wide_graph(sched):
    rng = np.random.default_rng(1)
    g = random_graph(rng, 300, 60, TILE)
    m = two_device_machine(capacity_gib=40 * TILE_BYTES / 2**30, n_devices=3, workers_per_device=2)
    r = simulate(g, m, sched, durations=rng.uniform(1e-5, 1e-4, size=(1, g.n_tasks)))
    assert r.summary["critical_path_s"] <= r.makespan
    assert r.summary["utilization"] <= 1.0 + 1e-9
    tr = r.trace()
    assert (tr["task"] >= 0).sum() == g.n_tasks
    assert len(tr) == g.n_tasks + r.summary["transfers"]
