"""A scheduler's probe fits used outside the probes' range: the host cost's fixed term of a small step, and
dmdas's cost per task walked past on a queue ten times longer than the probes'."""

import pytest

from tilecast.loop import host_cost
from tilecast.loop.host_cost import HostCost, fit_beside
from tilecast.perfmodel import load_machine
from tilecast.simulator.simulate import simulate

# the probe steps' (tiles, tasks, makespan s) on gpt2-tiny (host_cost.PROBES); the last three are SCHED_PROBES
SIZES = [(218, 163, 0.002), (315, 264, 0.009), (877, 1214, 0.021), (1169, 2342, 0.075), (3849, 13402, 0.30)]
FIXED, PER_TILE = 1.5e-3, 2e-6


def host(tiles, tasks, per_task):
    return FIXED + PER_TILE * tiles + per_task * tasks


def test_a_schedulers_fixed_host_cost_is_the_one_the_small_probes_measured():
    """The scheduler probes (1,214-13,402 tasks) cannot tell a fixed cost from the costs per tile and per task:
    a fit of all three on them, with the host times 10-25% off as a loaded probe gives them, put 3.8 ms into
    the fixed cost (1.5 ms true) and a 277-task step's host time 66% high. Beside eager's fit (all five probes,
    down to 163 tasks) only the cost per task is the scheduler's own."""
    base = HostCost.fit(1, [[t, n, mk, host(t, n, 0.5e-6)] for t, n, mk in SIZES])
    assert base.fixed_s == pytest.approx(FIXED, rel=1e-6)
    noise = [1.25, 0.8, 1.1]
    own = [[t, n, mk, host(t, n, 1.2e-6) * f] for (t, n, mk), f in zip(SIZES[2:], noise)]
    fit = fit_beside(base, 1, own, overheads=[[60000, 2e-6]])
    assert (fit.fixed_s, fit.per_tile_s) == (base.fixed_s, base.per_tile_s)
    assert fit.per_task_s == pytest.approx(1.2e-6, rel=0.4)
    truth = host(353, 277, 1.2e-6)  # gpt2-3x96 at tile 256: 353 tiles, 277 tasks
    assert abs(fit.seconds(353, 277) - truth) < 0.1 * truth
    three_terms = HostCost.fit(1, own)  # what the scheduler's probe fit was
    assert abs(three_terms.seconds(353, 277) - truth) > 0.5 * truth
    assert fit_beside(None, 1, own).fixed_s == three_terms.fixed_s  # no eager fit: the three-term fit


def test_a_schedulers_host_time_below_eagers_gives_no_negative_cost():
    base = HostCost.fit(2, [[t, n, mk, host(t, n, 0.5e-6)] for t, n, mk in SIZES])
    fit = fit_beside(base, 2, [[t, n, mk, 0.5 * FIXED] for t, n, mk in SIZES[2:]])
    assert fit.per_task_s == 0.0 and fit.seconds(353, 277) >= 0.0


def test_the_queue_probes_walk_is_what_the_simulator_counts():
    """measure_sorted's walks: each insertion walks past every queued task of at least its priority, as the
    simulated dmdas counts a walk (DequeModel._walked, fifo_queues.c _starpu_fifo_push_sorted_task), whatever
    the order of the priorities; equal priorities walk past none."""
    import numpy as np

    from tilecast.loop.queue_probe import insertion_walks
    from tilecast.simulator.policies.deque_model import DequeModel

    shuffled = np.random.default_rng(3).permutation(100) + 1.0
    for priorities in (range(100, 0, -1), shuffled, range(1, 101), [0.0] * 100):
        q = DequeModel()
        q.keys = [[]]
        simulated = [q._walked(0, -float(p)) for p in priorities]
        assert list(insertion_walks(list(priorities))) == simulated
    assert insertion_walks(range(100, 0, -1)).sum() == 100 * 99 // 2  # decreasing: past every queued task
    assert insertion_walks(range(1, 101)).sum() == 0 and insertion_walks([0.0] * 100).sum() == 0


def test_the_walk_fit_stays_within_the_cost_measured_on_starpu(tmp_path, monkeypatch):
    """Probe makespans made with 40 ns a task walked past (the fit without a measured cost finds it back:
    test_decision_cost.py); with the cost measured on a queue of known length (5 ns) the fit keeps that:
    the rest of the probes' difference is not the walk's."""
    from tilecast.loop.decision_cost import fit_sorting

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    probes = [g for *_, g in host_cost.probe_graphs(host_cost.SCHED_PROBES[:2])]  # the two smaller ones
    one = load_machine("local").with_workers(1).with_task_overhead(4e-6)
    measured = [simulate(g, one.with_push_walk(4e-8), "dmdas").makespan for g in probes]
    walk, overhead = fit_sorting(one, None, probes, measured, "dmdas", None, None, cap=5e-9)
    assert walk == pytest.approx(5e-9) and overhead == 4e-6
