"""dmdas beside dmda in alternated sessions (tilecast/loop/walk_pairs.py): the pairs' order and median ratio, and
the probe fit taking the walk from that ratio instead of the two sessions' own."""

import pytest
from test_walk_in_step import _makespans, _probe_fit, two  # noqa: F401 (a fixture)

from tilecast.loop import host_cost
from tilecast.loop.walk_pairs import measure_walk_pairs, pair_ratio, ratio_interval


def test_the_ratio_is_the_median_of_the_pairs():
    assert pair_ratio([(1.2, 1.0), (2.2, 2.0), (5.0, 2.0)]) == pytest.approx(1.2)
    assert pair_ratio([]) is None


def test_the_ratio_interval_is_the_order_statistics_that_hold_the_median():
    """Eight pairs: the 2nd smallest and 2nd largest ratio (1 - 2 P(Bin(8, 1/2) <= 1) = 0.93; the 3rd would hold
    the median with 0.71); four pairs: the whole range (0.875 at most); none: None."""
    ratios = [1.3, 0.8, 1.0, 1.05, 0.95, 1.1, 0.9, 1.2]
    assert ratio_interval([(r * 2.0, 2.0) for r in ratios]) == pytest.approx((0.9, 1.2))
    assert ratio_interval([(r, 1.0) for r in ratios[:4]]) == pytest.approx((0.8, 1.3))
    assert ratio_interval([(1.0, 1.0), (1.1, 0.0)]) == (1.0, 1.0)  # a pair with no companion time is left out
    assert ratio_interval([]) is None
    lo, hi = ratio_interval([(r, 1.0) for r in ratios], coverage=0.5)
    assert 0.9 < lo <= hi < 1.2


def test_the_sessions_alternate_on_the_longest_probe(monkeypatch):
    calls = []

    def walls(workers, probes, repeats, sched, progress):
        calls.append((workers, probes, repeats, sched))
        return [(None, 1.1 if sched == "dmdas" else 1.0, 0.0, None, 0.0)]

    monkeypatch.setattr(host_cost, "measure_walls", walls)
    got = measure_walk_pairs(2, "dmdas", "dmda", pairs=3, repeats=2)
    assert got == [(1.1, 1.0)] * 3
    assert [c[3] for c in calls] == ["dmdas", "dmda", "dmda", "dmdas", "dmdas", "dmda"]
    longest = max(host_cost.SCHED_PROBES, key=lambda p: host_cost.probe_graphs((p,))[0][3].n_tasks)
    assert all(c[:3] == (2, (longest,), 2) for c in calls)


def test_the_walk_follows_the_pairs_ratio_not_the_sessions(two, probes):  # noqa: F811
    """The sessions' makespans made without a walk (dmdas as fast as dmda, as one unlucky pair of sessions
    measures it); the alternated pairs' ratio is that of 40 ns a step: the fit takes 40 ns."""
    truth = 4e-8
    dmda = _makespans(two, probes, "dmda")
    walked = _makespans(two.with_push_walk(truth), probes, "dmdas")
    i = max(range(len(probes)), key=lambda k: probes[k].n_tasks)
    companion = _probe_fit(dmda, 4e-6)
    probe = _probe_fit(_makespans(two.with_push_walk(1e-9), probes, "dmdas"), 4e-6, walk_step_s=2e-9)
    host_cost.fit_walks(probe, two, None, companion, "dmdas", probes)
    assert probe.push_walk_s < 0.5 * truth  # the sessions' own ratio: no dear walk
    again = _probe_fit(_makespans(two.with_push_walk(1e-9), probes, "dmdas"), 4e-6, walk_step_s=2e-9)
    host_cost.fit_walks(again, two, None, companion, "dmdas", probes, longest_ratio=walked[i] / dmda[i])
    assert again.push_walk_s == pytest.approx(truth, rel=0.1)
