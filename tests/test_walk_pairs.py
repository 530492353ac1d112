"""dmdas beside dmda in alternated sessions (tilecast/loop/walk_pairs.py): the pairs' order and median ratio, and
the probe fit taking the walk from that ratio instead of the two sessions' own."""

import pytest
from test_walk_in_step import _makespans, _probe_fit, two  # noqa: F401 (a fixture)

from tilecast.loop import host_cost
from tilecast.loop.walk_pairs import measure_walk_pairs, pair_ratio


def test_the_ratio_is_the_median_of_the_pairs():
    assert pair_ratio([(1.2, 1.0), (2.2, 2.0), (5.0, 2.0)]) == pytest.approx(1.2)
    assert pair_ratio([]) is None


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
