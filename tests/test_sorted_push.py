"""dmdas's and dmdasd's sorted insertions: the pushing worker pays for each queued task it walks past.

StarPU 1.3.10's ``_starpu_fifo_push_sorted_task`` (src/sched_policies/fifo_queues.c)
walks a worker's queue from its head past every task of at least the new
one's priority; the worker that released the task does it before it pops its
next one. Checked on a graph where every walk is known, and every loop
(general, fused, C) against the others bit for bit.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_graphs import random_graph
from sim_machines import cpu_machine, two_device_machine
from test_sim_fused import TILE, _outcome, assert_same_outcome, cases

from tilecast.graph import GraphBuilder, Tiling
from tilecast.simulator import native
from tilecast.simulator.simulate import simulate

HAS_C = native.library() is not None
WALK = 1e-4


def fan_out():
    """Task 0 writes a tile that tasks 1, 2 and 3 read: ending it releases all three at once."""
    b = GraphBuilder(Tiling.uniform(TILE))
    t = b.tensor("pool", (5 * TILE, TILE), ("seq", None), "param")
    b.add("axpy", [t.tile_ids(1, 0), t.tile_ids(0, 0)], dict(n=TILE * TILE, alpha=0.5))
    for k in (2, 3, 4):
        b.add("axpy", [t.tile_ids(0, 0), t.tile_ids(k, 0)], dict(n=TILE * TILE, alpha=0.5))
    return b.build()


def loops(graph, machine, durations, sched, priority=None):
    """Each loop's (start, end, worker): general, fused (dmdas), C (where built)."""
    from tilecast.simulator.engine import Engine

    out = {}
    for name, fused, nat in (("general", False, False), ("fused", True, False), ("c", True, True)):
        if (name == "fused" and sched != "dmdas") or (nat and not HAS_C):
            continue
        Engine.fused_loops, Engine.native_loop = fused, nat
        try:
            r = simulate(graph, machine, sched, durations=durations, priority=priority)
        finally:
            Engine.fused_loops = Engine.native_loop = True
        out[name] = (r.start, r.end, r.worker)
    return out


@pytest.mark.parametrize("sched", ["dmdas", "dmdasd"])
def test_the_worker_that_releases_tasks_walks_its_queue_before_its_next_task(sched):
    g = fan_out()
    d = np.full((1, g.n_tasks), 1e-3)
    prio = np.array([100, 10, 20, 5])
    m = cpu_machine(1)
    for name, (start, end, _) in loops(g, m.with_push_walk(WALK), d, sched, prio).items():
        # 1 (queue empty) and 2 (ahead of 1) walk past nothing; 3 (lowest) past both: 2 x WALK before the
        # worker pops, and it pops the highest priority of the three first
        assert start[2] == pytest.approx(1e-3 + 2 * WALK), name
        assert start[1] == pytest.approx(2e-3 + 2 * WALK) and start[3] == pytest.approx(3e-3 + 2 * WALK), name
    for name, (start, _, _) in loops(g, m, d, sched, prio).items():
        # without the charge, task 1 starts as soon as it is pushed (as before)
        assert list(start) == pytest.approx([0.0, 1e-3, 2e-3, 3e-3]), name


def test_equal_priorities_are_appended_without_a_walk():
    g = fan_out()
    d = np.full((1, g.n_tasks), 1e-3)
    res = loops(g, cpu_machine(1).with_push_walk(WALK), d, "dmdas", np.array([100, 7, 7, 7]))
    for name, (start, _, _) in res.items():
        assert list(start) == pytest.approx([0.0, 1e-3, 2e-3, 3e-3]), name


def test_the_submitting_thread_is_not_charged():
    """Tasks ready at submission are pushed by the thread submitting the graph, not by a worker: the last two
    walk past one and two queued tasks, and no task waits for that."""
    b = GraphBuilder(Tiling.uniform(TILE))
    t = b.tensor("pool", (8 * TILE, TILE), ("seq", None), "param")
    for k in range(4):
        b.add("axpy", [t.tile_ids(2 * k, 0), t.tile_ids(2 * k + 1, 0)], dict(n=TILE * TILE, alpha=0.5))
    g = b.build()
    d = np.full((1, g.n_tasks), 1e-3)
    for name, (start, _, _) in loops(g, cpu_machine(1).with_push_walk(WALK), d, "dmdas",
                                     np.array([4, 3, 2, 1])).items():
        assert sorted(start) == pytest.approx([0.0, 1e-3, 2e-3, 3e-3]), name


@st.composite
def walking_cases(draw):
    """A sorted policy's case with a walk, its steps past a knee dearer or cheaper in some (far factor 0: none)."""
    graph, machine, durations, _, transfers = draw(cases())
    walk = draw(st.sampled_from([1e-7, 3e-6, 2e-5]))
    far = walk * draw(st.sampled_from([0.0, 0.5, 3.0, 10.0]))
    machine = machine.with_push_walk(walk).with_walk_far(far, draw(st.sampled_from([0, 1, 3, 40])))
    return graph, machine, durations, draw(st.sampled_from(["dmdas", "dmdasd"])), transfers


@settings(max_examples=140, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(walking_cases())
def test_every_loop_charges_the_same_walks(case):
    general = _outcome(*case, fused=False)
    if case[3] == "dmdas":
        assert_same_outcome(general, _outcome(*case, fused=True))
    if HAS_C:
        assert_same_outcome(general, _outcome(*case, fused=False, native=True))


@pytest.mark.parametrize("sched", ["dmdas", "dmdasd"])
def test_long_sorted_queues_cost_more_the_more_they_hold(sched):
    """Thousands of tasks ready at once: every loop alike; on one worker (never idle) the step longer than
    without the walks; only the sorted policies charged."""
    g = random_graph(np.random.default_rng(11), 3000, 2500, TILE)
    m = two_device_machine(capacity_gib=64 * TILE * TILE * 4 / 2**30, n_devices=2, workers_per_device=2)
    d = np.random.default_rng(12).integers(1, 50, size=(len(m.kind_names), g.n_tasks)) * 1e-6
    walking = m.with_push_walk(2e-7)
    general = _outcome(g, walking, d, sched, True, fused=False)
    assert not isinstance(general, str), general
    if sched == "dmdas":
        assert_same_outcome(general, _outcome(g, walking, d, sched, True, fused=True))
    if HAS_C:
        assert_same_outcome(general, _outcome(g, walking, d, sched, True, fused=False, native=True))
    assert simulate(g, walking, "dmda", durations=d).makespan == simulate(g, m, "dmda", durations=d).makespan
    one = cpu_machine(1)
    d1 = d[:1]
    assert simulate(g, one.with_push_walk(2e-7), sched, durations=d1).makespan > \
        simulate(g, one, sched, durations=d1).makespan


@pytest.mark.parametrize("sched", ["dmdas", "dmdasd"])
def test_steps_beyond_the_knee_cost_the_far_figure_in_every_loop(sched):
    """Task 3's insertion walks past 2 queued tasks: with a knee of 1, one step at the near cost and one at the
    far cost (queue_costs.list_walk_s), in every loop; prio's tree search is not a list and gets no far cost."""
    from tilecast.simulator.queue_costs import list_walk_s, walk_far_of

    g = fan_out()
    d = np.full((1, g.n_tasks), 1e-3)
    prio = np.array([100, 10, 20, 5])
    far = 7 * WALK
    m = cpu_machine(1).with_push_walk(WALK).with_walk_far(far, 1)
    assert list_walk_s(2, WALK, far, 1) == pytest.approx(WALK + far)
    for name, (start, _, _) in loops(g, m, d, sched, prio).items():
        assert start[2] == pytest.approx(1e-3 + WALK + far), name
    assert walk_far_of(m, sched) == (far, 1.0) and walk_far_of(m, "prio") == (0.0, 0.0)
    for name, (start, _, _) in loops(g, cpu_machine(1).with_push_walk(WALK).with_walk_far(far, 2), d, sched,
                                     prio).items():
        assert start[2] == pytest.approx(1e-3 + 2 * WALK), name  # within the knee: the near cost alone

