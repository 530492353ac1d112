"""Durations the simulation cannot take are refused in one line before any loop runs; those it takes give finite
times (tilecast/simulator/valid_durations.py).

A NaN or negative duration, or a task no worker of the machine can run, once ran to NaN or infinite start and end
times (and numpy's "invalid value" warnings in the summary); an inf duration on one kind ran under the policies
that hand a task to any worker.
"""

import warnings

import numpy as np
import pytest
from sim_graphs import random_graph
from sim_machines import cpu_machine, two_device_machine

from tilecast.errors import FieldError
from tilecast.simulator.engine import Engine
from tilecast.simulator.simulate import POLICIES, simulate
from tilecast.simulator.valid_durations import CHOOSE_AMONG_KINDS

GRAPH = random_graph(np.random.default_rng(4), 60, 8, 32)
MIXED = two_device_machine(n_devices=2, host_workers=2)  # kinds acc (devices) and cpu (host)


def _loops():
    """(name, fused, native) of every loop simulate() can run."""
    return [("general", False, False), ("fused", True, False), ("c", True, True)]


def _simulate(durations, sched, machine=MIXED, fused=True, native=True):
    Engine.fused_loops, Engine.native_loop = fused, native
    try:
        return simulate(GRAPH, machine, sched, durations=durations)
    finally:
        Engine.fused_loops = Engine.native_loop = True


def _durations(machine=MIXED):
    return np.random.default_rng(5).integers(1, 5, size=(len(machine.kind_names), GRAPH.n_tasks)) * 1e-5


@pytest.mark.parametrize("value, says", [(np.nan, "takes nan s"), (-1e-5, "takes -1e-05 s")])
@pytest.mark.parametrize("sched", list(POLICIES))
def test_nan_or_negative_is_refused_naming_the_task(value, says, sched):
    d = _durations()
    d[1, 17] = value
    for name, fused, native in _loops():
        with pytest.raises(FieldError) as e:
            _simulate(d, sched, fused=fused, native=native)
        assert str(e.value).startswith(f"durations: task 17 {says} on worker kind 'cpu'"), (name, str(e.value))


@pytest.mark.parametrize("sched", list(POLICIES))
def test_a_task_no_worker_can_run_is_refused(sched):
    d = _durations()
    d[:, 9] = np.inf
    with pytest.raises(FieldError, match="durations: task 9 is inf on every worker kind of the machine"):
        _simulate(d, sched)
    one = cpu_machine(2)
    d1 = _durations(one)
    d1[0, 3] = np.inf
    with pytest.raises(FieldError, match="durations: task 3 is inf on every worker kind"):
        _simulate(d1, sched, machine=one)


@pytest.mark.parametrize("sched", sorted(set(POLICIES) - set(CHOOSE_AMONG_KINDS)))
def test_a_kind_that_cannot_run_a_task_is_refused_where_the_policy_would_give_it_one(sched):
    d = _durations()
    d[0, 5] = np.inf
    with pytest.raises(FieldError, match=f"durations: task 5 is inf on worker kind 'acc'; policy '{sched}'"):
        _simulate(d, sched)


@pytest.mark.parametrize("sched", CHOOSE_AMONG_KINDS)
def test_the_dm_family_runs_such_tasks_on_the_kinds_that_can_with_finite_times(sched):
    d = _durations()
    cannot = np.random.default_rng(6).random(GRAPH.n_tasks) < 0.3
    d[0, cannot] = np.inf  # the devices cannot run these
    kind_of_worker = np.array([MIXED.kind_names.index(w.kind) for w in MIXED.workers])
    results = []
    for name, fused, native in _loops():
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "invalid value encountered" on the way
            r = _simulate(d, sched, fused=fused, native=native)
        s = r.summary
        assert np.isfinite(r.start).all() and np.isfinite(r.end).all(), name
        assert np.isfinite(s["busy_s"]).all() and np.isfinite(s["idle_s"]).all(), name
        assert 0 < s["utilization"] <= 1 and 0 < s["makespan_s"] < np.inf, name
        assert (kind_of_worker[r.worker[cannot]] == 1).all(), name  # on the host's cpu workers
        results.append((r.start, r.end, r.worker))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)
