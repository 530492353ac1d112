"""The C loop (tilecast/simulator/native.py) gives exactly what the Python engine gives, for every policy.

The Python engine (Engine + policy + Memory + Links) is the readable statement of
the model; c/tcsim.c restates all of it for speed. Both run here on the same
random graphs and machines (test_sim_fused's strategy, every policy) and must
agree bit for bit: every task's start, end and worker, every transfer, peak
memory, evictions and write-backs, or the error both raise. The dm family's
Python fused loop is compared with the C loop too, and the C graph sweeps
(bottom levels, earliest finishes) with the Python ones.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_graphs import gemm_chain_graph, random_graph
from sim_machines import two_device_machine
from test_sim_fused import FUSED, TILE, _outcome, assert_same_outcome, cases

from tilecast.graph.analysis import longest_path_end
from tilecast.graph.priorities import bottom_level
from tilecast.simulator import native
from tilecast.simulator.simulate import POLICIES, simulate

pytestmark = pytest.mark.skipif(native.library() is None, reason="the C loop cannot be built here (cffi or cc missing)")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(POLICIES))
def test_the_c_loop_equals_the_general_loop(case):
    assert_same_outcome(_outcome(*case, fused=False), _outcome(*case, fused=False, native=True))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_the_c_loop_equals_the_fused_loop(case):
    assert_same_outcome(_outcome(*case, fused=True), _outcome(*case, fused=False, native=True))


@pytest.mark.parametrize("sched", list(POLICIES))
def test_every_policy_on_a_larger_graph_with_evictions(sched):
    """A few thousand tasks on a small device memory: long queues, evictions and write-backs."""
    g = random_graph(np.random.default_rng(7), 3000, 40, TILE)
    m = two_device_machine(capacity_gib=12 * TILE * TILE * 4 / 2**30, n_devices=3, workers_per_device=2,
                           host_workers=1, bw_gbps=1.0)
    d = np.random.default_rng(8).integers(1, 9, size=(len(m.kind_names), g.n_tasks)) * 1e-5
    general = _outcome(g, m, d, sched, True, fused=False)
    assert not isinstance(general, str), general
    assert_same_outcome(general, _outcome(g, m, d, sched, True, fused=False, native=True))
    if sched in FUSED:
        assert_same_outcome(general, _outcome(g, m, d, sched, True, fused=True))


@pytest.mark.parametrize("sched", ["prio", "dmdas", "dmdasd"])
def test_long_sorted_queues(sched):
    """A wide graph (thousands of tasks ready at once): queues of hundreds of tasks, inserted anywhere."""
    g = random_graph(np.random.default_rng(11), 4000, 3000, TILE)
    m = two_device_machine(capacity_gib=64 * TILE * TILE * 4 / 2**30, n_devices=2, workers_per_device=2)
    d = np.random.default_rng(12).integers(1, 50, size=(len(m.kind_names), g.n_tasks)) * 1e-6
    general = _outcome(g, m, d, sched, True, fused=False)
    assert not isinstance(general, str), general
    assert_same_outcome(general, _outcome(g, m, d, sched, True, fused=False, native=True))


@pytest.mark.parametrize("costs", [(1e-6, 0.0), (0.0, 2e-5), (3e-7, 1e-5)])
def test_decision_costs(costs, monkeypatch):
    """dmdasd's decisions charged (queued tasks read, other workers locked; no priority range declared, so
    that they read the queues): both loops alike, and the step longer than without them and at least as long
    as the decisions, which run one at a time."""
    monkeypatch.setenv("TILECAST_PRIORITY_LEVELS", "0")
    g = random_graph(np.random.default_rng(11), 4000, 3000, TILE)
    m = two_device_machine(capacity_gib=64 * TILE * TILE * 4 / 2**30, n_devices=2, workers_per_device=2)
    d = np.random.default_rng(12).integers(1, 50, size=(len(m.kind_names), g.n_tasks)) * 1e-6
    charged = m.with_decision_cost(*costs)
    general = _outcome(g, charged, d, "dmdasd", True, fused=False)
    assert not isinstance(general, str), general
    assert_same_outcome(general, _outcome(g, charged, d, "dmdasd", True, fused=False, native=True))
    free = simulate(g, m, "dmdasd", durations=d).makespan
    # each task is decided once, locking at least every other worker's queue, before it starts
    charged_makespan = simulate(g, charged, "dmdasd", durations=d).makespan
    assert charged_makespan >= g.n_tasks * (len(m.workers) - 1) * costs[1] * 0.999
    assert charged_makespan > free
    # the other policies do not decide that way: unchanged
    assert simulate(g, charged, "dmdas", durations=d).makespan == simulate(g, m, "dmdas", durations=d).makespan


def test_the_c_loop_is_the_one_that_runs(monkeypatch):
    """Guard against simulate() silently falling back to the Python loops."""
    calls = []
    real = native.run
    monkeypatch.setattr(native, "run", lambda *a, **k: calls.append(1) or real(*a, **k))
    g = gemm_chain_graph()
    for sched in POLICIES:
        simulate(g, two_device_machine(), sched, durations=np.full((1, g.n_tasks), 1e-5))
    assert len(calls) == len(POLICIES)


def test_it_can_be_switched_off(monkeypatch):
    monkeypatch.setenv(native.ENV, "0")
    assert native.library() is None
    g = gemm_chain_graph()
    r = simulate(g, two_device_machine(), "dmda", durations=np.full((1, g.n_tasks), 1e-5))
    assert r.summary["tasks"] == g.n_tasks


def test_a_failed_build_falls_back_to_the_python_loops_with_one_line(monkeypatch, capsys):
    def fail(*a, **k):
        raise native.NativeUnavailable("building _tilecast_sim: no C compiler found (install: build-essential)")

    monkeypatch.delenv(native.ENV, raising=False)
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_failed", None)
    monkeypatch.setattr(native, "build_extension", fail)
    g = gemm_chain_graph()
    d = np.full((1, g.n_tasks), 1e-5)
    r = simulate(g, two_device_machine(), "eager", durations=d)
    simulate(g, two_device_machine(), "dmda", durations=d)  # tried once, said once
    assert native.library() is None and r.summary["tasks"] == g.n_tasks
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Python loops" in err and "no C compiler" in err


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 200), st.booleans())
def test_the_c_graph_sweeps_equal_the_python_ones(seed, n_tasks, odd):
    rng = np.random.default_rng(seed)
    g = random_graph(rng, n_tasks, 8, TILE)
    w = rng.integers(0, 4, size=n_tasks) * 0.5
    if odd:  # NaN and inf weights: max() keeps the first of the greatest, as Python's does
        w[rng.random(n_tasks) < 0.1] = np.nan
        w[rng.random(n_tasks) < 0.1] = np.inf
    pred_ptr, pred = g.dependencies
    np.testing.assert_array_equal(native.longest_path_end(w, pred_ptr, pred), longest_path_end(w, pred_ptr, pred))
    np.testing.assert_array_equal(native.bottom_level(w, pred_ptr, pred), bottom_level(w, pred_ptr, pred))


@pytest.mark.parametrize("make", [lambda: gemm_chain_graph(), lambda: random_graph(np.random.default_rng(3), 200, 9, TILE)])
def test_footprint_groups_by_keys_equal_the_groups_by_rows(make):
    from tilecast.graph.priorities import footprint_groups, footprint_groups_by_rows

    g = make()
    np.testing.assert_array_equal(footprint_groups(g), footprint_groups_by_rows(g))


def test_footprint_groups_of_a_gpt2_step_by_keys_equal_the_groups_by_rows():
    from tilecast.graph import Tiling
    from tilecast.graph.gpt2 import build_gpt2_step
    from tilecast.graph.model_config import load_model
    from tilecast.graph.priorities import footprint_groups, footprint_groups_by_rows

    g = build_gpt2_step(load_model("gpt2"), 1, 128, Tiling.parse("seq=32,embd=96"))  # ragged last tiles
    np.testing.assert_array_equal(footprint_groups(g), footprint_groups_by_rows(g))


@pytest.mark.parametrize("sched", list(POLICIES))
def test_costs_between_tasks(sched):
    """The runtime's cost per buffer and per successor between a worker's tasks (tilecast.simulator.gap_cost):
    every loop alike, with dmdas's sorted insertions charged to the same worker too, and the step longer."""
    g = random_graph(np.random.default_rng(7), 1500, 40, TILE)
    m = two_device_machine(capacity_gib=64 * TILE * TILE * 4 / 2**30, n_devices=2, workers_per_device=2)
    d = np.random.default_rng(8).integers(1, 50, size=(len(m.kind_names), g.n_tasks)) * 1e-6
    gapped = m.with_gap_costs(2e-6, 5e-7, 1.5e-6, 2.5e-6, 3e-6, 4e-12, 1e5).with_push_walk(1e-7)
    general = _outcome(g, gapped, d, sched, True, fused=False)
    assert not isinstance(general, str), general
    assert_same_outcome(general, _outcome(g, gapped, d, sched, True, fused=False, native=True))
    if sched in FUSED:
        assert_same_outcome(general, _outcome(g, gapped, d, sched, True, fused=True))
    assert simulate(g, gapped, sched, durations=d).makespan > simulate(g, m.with_push_walk(1e-7), sched,
                                                                       durations=d).makespan
