"""prio's priority tree: each push and pop searches a red-black tree of priority stages, charged per level.

StarPU 1.3.10's prio keeps its central queue as a ``starpu_task_prio_list``
(src/common/prio_list.h): a red-black tree with one stage per distinct
priority queued. A push looks its stage up (``prio_list_add``), a pop finds
the first non-empty stage and looks it up again to erase the task; both walk
the tree's height. Checked on a graph where every charge is known, and the
general and C loops against each other bit for bit.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_graphs import random_graph
from sim_machines import cpu_machine, two_device_machine
from test_sim_fused import TILE, _outcome, assert_same_outcome, cases
from test_sorted_push import fan_out, loops

from tilecast.simulator import native
from tilecast.simulator.queue_costs import RULES, StageCount, priority_stages, tree_levels
from tilecast.simulator.simulate import POLICIES, simulate

HAS_C = native.library() is not None
WALK = 1e-4


def test_every_simulated_policy_has_a_rule_citing_starpu():
    assert set(RULES) == set(POLICIES)
    for name, rule in RULES.items():
        assert ".c:" in rule.source or ".c " in rule.source or ".h:" in rule.source, name


@pytest.mark.parametrize("n, levels", [(0, 0), (1, 1), (2, 2), (3, 2), (4, 3), (1023, 10), (1024, 11)])
def test_tree_levels_are_the_height_of_a_balanced_tree(n, levels):
    assert tree_levels(n) == levels


def test_equal_priorities_share_a_stage():
    stages = priority_stages([5.0, 7.0, 5.0, -1.0])
    assert list(stages) == [1, 2, 1, 0]
    count = StageCount(stages)
    assert [count.add(t) for t in range(4)] == [0, 1, 2, 2]  # 0 stages, then 1, 2 (task 2 joins 5's), 2
    assert count.stages == 3
    assert count.remove(0) == 2 and count.stages == 3  # 5's stage keeps task 2
    assert count.remove(2) == 2 and count.stages == 2


def test_each_push_and_pop_costs_the_tree_height():
    """Task 0 ends and releases 1, 2, 3 (priorities 10, 20, 5) on one worker: its pushes search 0, 1 and 2
    levels, then the pops 2, 2 and 1; task 0's own pop searched 1 (its push, by the submitting thread, is not
    charged)."""
    g = fan_out()
    d = np.full((1, g.n_tasks), 1e-3)
    prio = np.array([100, 10, 20, 5])
    res = loops(g, cpu_machine(1).with_push_walk(WALK), d, "prio", prio)
    assert set(res) == ({"general", "c"} if HAS_C else {"general"})
    for name, (start, _, _) in res.items():
        assert start[0] == pytest.approx(WALK), name
        assert start[2] == pytest.approx(1e-3 + 6 * WALK), name  # 1 + (0 + 1 + 2) pushes + 2 for its pop
        assert start[1] == pytest.approx(2e-3 + 8 * WALK), name
        assert start[3] == pytest.approx(3e-3 + 9 * WALK), name
    for name, (start, _, _) in loops(g, cpu_machine(1), d, "prio", prio).items():
        # not charged, the same order: the worker pops once it has pushed all three (Policy.pops_after_pushing)
        assert list(start) == pytest.approx([0.0, 2e-3, 1e-3, 3e-3]), name


def test_equal_priorities_make_a_shallower_tree():
    g = fan_out()
    d = np.full((1, g.n_tasks), 1e-3)
    for name, (start, _, _) in loops(g, cpu_machine(1).with_push_walk(WALK), d, "prio",
                                     np.array([100, 7, 7, 7])).items():
        # pushes 0 + 1 + 1 levels, then each pop 1 level (one stage)
        assert start[1] == pytest.approx(1e-3 + 4 * WALK), name
        assert start[3] == pytest.approx(3e-3 + 6 * WALK), name


@st.composite
def prio_cases(draw):
    graph, machine, durations, _, transfers = draw(cases(["prio"]))
    walk = draw(st.sampled_from([1e-7, 3e-6, 2e-5]))
    return graph, machine.with_push_walk(walk), durations, "prio", transfers


@pytest.mark.skipif(not HAS_C, reason="the C loop cannot be built here (cffi or cc missing)")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prio_cases())
def test_the_c_loop_charges_the_same_tree_searches(case):
    assert_same_outcome(_outcome(*case, fused=False), _outcome(*case, fused=False, native=True))


def test_a_deep_tree_costs_more_and_other_central_policies_are_not_charged():
    """Thousands of tasks ready at once: both loops alike; on one worker the step longer than without the
    charge; eager (a FIFO) unchanged."""
    g = random_graph(np.random.default_rng(11), 3000, 2500, TILE)
    m = two_device_machine(capacity_gib=64 * TILE * TILE * 4 / 2**30, n_devices=2, workers_per_device=2)
    d = np.random.default_rng(12).integers(1, 50, size=(len(m.kind_names), g.n_tasks)) * 1e-6
    walking = m.with_push_walk(2e-7)
    general = _outcome(g, walking, d, "prio", True, fused=False)
    assert not isinstance(general, str), general
    if HAS_C:
        assert_same_outcome(general, _outcome(g, walking, d, "prio", True, fused=False, native=True))
    assert simulate(g, walking, "eager", durations=d).makespan == simulate(g, m, "eager", durations=d).makespan
    one, d1 = cpu_machine(1), d[:1]  # never idle: every search lengthens the step
    assert simulate(g, one.with_push_walk(2e-7), "prio", durations=d1).makespan > \
        simulate(g, one, "prio", durations=d1).makespan


def test_the_fit_recovers_the_cost_per_level_beside_eager(tmp_path, monkeypatch):
    """prio's probe makespans simulated with a known cost per tree level, and measured 20% slower than
    simulated under both prio and eager, are fitted back to that cost by the ratio to eager's."""
    from tilecast.loop import host_cost
    from tilecast.loop.decision_cost import fit_push_walk
    from tilecast.perfmodel import load_machine

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    probes = [g for *_, g in host_cost.probe_graphs(host_cost.SCHED_PROBES)]
    one = load_machine("local").with_workers(1).with_task_overhead(4e-6)
    truth = 1e-7
    measured = [1.2 * simulate(g, one.with_push_walk(truth), "prio").makespan for g in probes]
    free = [1.2 * simulate(g, one, "prio").makespan for g in probes]
    assert max(m / f for m, f in zip(measured, free)) > 1.03  # the tree's searches matter on these probes
    eager = [1.2 * simulate(g, one, "eager").makespan for g in probes]
    walk = fit_push_walk(one, None, probes, measured, sched="prio", beside=("eager", eager))
    assert walk == pytest.approx(truth, rel=0.2)


def test_the_pushing_worker_does_not_keep_the_other_workers_idle():
    """Two workers: the worker that ends task 0 pushes 1, 2, 3 while the other is idle. The idle one is offered
    the first task pushed (it is not the pushing worker, who pops once it has pushed all three), so two of
    the three run at once, as without the charge. (Offering it to the pushing worker, the lowest-numbered
    idle one, left the other idle for good: prio on two workers simulated as one.)"""
    g = fan_out()
    d = np.full((1, g.n_tasks), 1e-3)
    prio = np.array([100, 10, 20, 5])
    for walk in (0.0, WALK):
        for name, (start, end, worker) in loops(g, cpu_machine(2).with_push_walk(walk), d, "prio", prio).items():
            assert worker[1] != worker[2], (walk, name)
            assert start[1] < end[2] and start[2] < end[1], (walk, name)  # they overlap
            assert max(end) < 3.5e-3, (walk, name)  # three rounds of 1 ms, not four


def test_a_small_charge_per_level_keeps_both_workers_busy():
    """On a random graph, prio on two workers with a cost per tree level far below a task's duration gives
    about the step without it (not the one-worker step it gave when the pusher held the others idle)."""
    g = random_graph(np.random.default_rng(5), 600, 500, TILE)
    two, one = cpu_machine(2), cpu_machine(1)
    d = np.random.default_rng(6).integers(10, 50, size=(1, g.n_tasks)) * 1e-6
    free = simulate(g, two, "prio", durations=d).makespan
    alone = simulate(g, one, "prio", durations=d).makespan
    assert free < 0.8 * alone  # the graph has work for two
    for native_loop in ((False, True) if HAS_C else (False,)):
        from tilecast.simulator.engine import Engine

        Engine.native_loop = native_loop
        try:
            charged = simulate(g, two.with_push_walk(1e-10), "prio", durations=d).makespan
        finally:
            Engine.native_loop = True
        assert charged < 1.05 * free, native_loop
