"""dmdas's walk as a step pays it: fitted on the longest scheduler probe beside dmda, within the queue probe's near
cost and a bound, and taken by the probe fit where it is dearer than the walk fitted on all the probes."""

import pytest

from tilecast.loop import host_cost
from tilecast.loop.host_cost import HostCost
from tilecast.loop.walk_in_step import WALK_BOUND, fit_in_step_walk, longest_probe
from tilecast.perfmodel import load_machine
from tilecast.simulator.simulate import simulate


@pytest.fixture
def two(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    return load_machine("local").with_workers(2).with_task_overhead(4e-6)


def _makespans(machine, probes, sched):
    return [simulate(g, machine, sched).makespan for g in probes]


def test_the_fit_reads_back_the_walk_that_made_the_longest_probe(two, probes):
    truth = 4e-8
    measured = _makespans(two.with_push_walk(truth), probes, "dmdas")
    beside = ("dmda", _makespans(two, probes, "dmda"))
    assert longest_probe(probes) == max(range(len(probes)), key=lambda i: probes[i].n_tasks)
    walk = fit_in_step_walk(two, None, probes, measured, "dmdas", beside, floor=2e-9)
    assert walk == pytest.approx(truth, rel=0.1)
    # the other probes do not count: their makespans 30% off leave the fit where it was
    i = longest_probe(probes)
    off = [m if j == i else 1.3 * m for j, m in enumerate(measured)]
    assert fit_in_step_walk(two, None, probes, off, "dmdas", beside, floor=2e-9) == pytest.approx(walk)
    # measured 20% slower under both policies: the ratio to dmda's makespans still gives it
    slow = ("dmda", [1.2 * m for m in beside[1]])
    assert fit_in_step_walk(two, None, probes, [1.2 * m for m in measured], "dmdas", slow,
                            floor=2e-9) == pytest.approx(truth, rel=0.1)


def test_the_fit_stays_within_the_floor_and_the_bound(two, probes):
    beside = ("dmda", _makespans(two, probes, "dmda"))
    cheap = _makespans(two.with_push_walk(1e-9), probes, "dmdas")
    assert fit_in_step_walk(two, None, probes, cheap, "dmdas", beside, floor=5e-9) == pytest.approx(5e-9, rel=0.05)
    dear = _makespans(two.with_push_walk(5 * WALK_BOUND), probes, "dmdas")
    assert 0.9 * WALK_BOUND <= fit_in_step_walk(two, None, probes, dear, "dmdas", beside, floor=5e-9) <= WALK_BOUND
    assert fit_in_step_walk(two, None, probes, cheap, "dmdas", None, floor=5e-9) == 0.0  # nothing to compare with


def _probe_fit(points_makespans, overhead, walk_step_s=0.0):
    fit = HostCost.fit(2, [[100, 1000, mk, 1e-3] for mk in points_makespans], overheads=[[1e5, overhead]])
    fit.probe_points, fit.walk_step_s = len(points_makespans), walk_step_s
    return fit


def test_the_probe_fit_takes_the_walk_of_the_longest_probe_where_it_is_dearer(two, probes):
    """Makespans made with 40 ns a step walked past; the walk fitted on all the probes is held to the queue
    probe's 5 ns: the fit then takes the longest probe's walk, with dmda's cost per task."""
    truth = 4e-8
    companion = _probe_fit(_makespans(two, probes, "dmda"), 4e-6)
    probe = _probe_fit(_makespans(two.with_push_walk(truth), probes, "dmdas"), 4.5e-6, walk_step_s=5e-9)
    host_cost.fit_walks(probe, two, None, companion, "dmdas", probes)
    assert probe.push_walk_s == pytest.approx(truth, rel=0.1)
    assert probe.task_overhead_s == companion.task_overhead_s
    # the same makespans made without a walk beyond the queue probe's: the walk fitted on all the probes stays
    plain = _probe_fit(_makespans(two.with_push_walk(5e-9), probes, "dmdas"), 4e-6, walk_step_s=5e-9)
    host_cost.fit_walks(plain, two, None, companion, "dmdas", probes)
    assert plain.push_walk_s == pytest.approx(5e-9, rel=0.05)
