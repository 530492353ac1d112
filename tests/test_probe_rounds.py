"""Each scheduler's probes in several sessions, its fits made on the median one (tilecast.loop.probe_rounds)."""

import pytest
from sim_machines import cpu_machine

from tilecast.loop.host_cost import HostCost, ProbeSessions, probe_key
from tilecast.loop.probe_rounds import ROUNDS, mean_start_delay, median_round, round_key


def _result(delay: float, makespan: float = 0.01):
    """A probe session's result as measure_probes gives it, every step's mean start delay ``delay``."""
    points = [[10, 100, makespan, 0.001], [20, 1000, 10 * makespan, 0.002]]
    overheads = [[1000.0, delay], [2000.0, delay]]
    return points, overheads, [], 1e-6


def test_the_median_session_is_taken_whole():
    slow, mid, fast = _result(3e-6, 0.03), _result(1.2e-6, 0.02), _result(0.8e-6, 0.01)
    assert median_round([slow, fast, mid]) is mid
    assert median_round([mid]) is mid
    assert median_round([fast, slow]) is fast  # an even count: the lower middle one
    assert mean_start_delay(mid) == pytest.approx(1.2e-6)


def test_a_session_without_delays_is_never_the_median_of_others():
    empty = ([[10, 100, 0.01, 0.001]], [], [], 0.0)
    a, b = _result(1e-6), _result(2e-6)
    assert median_round([empty, a, b]) is a
    assert median_round([empty]) is empty
    with pytest.raises(ValueError):
        median_round([])


def test_every_scheduler_is_probed_in_interleaved_sessions():
    """The later sessions come after every scheduler's first: a slow spell of a few seconds meets one session of
    each scheduler, not all of one."""
    sessions = ProbeSessions({}, [], [(1, "lws"), (2, "ws")])
    keys = list(sessions.by_key)
    assert keys == [round_key(probe_key(w, s), r) for r in range(ROUNDS) for w, s in ((1, "lws"), (2, "ws"))]
    assert len(set(keys)) == 2 * ROUNDS >= 6
    second = sessions.by_key[round_key(probe_key(2, "ws"), 1)]
    assert second.what == f"executor probes (ws, 2 workers, session 2 of {ROUNDS})"


def test_a_schedulers_fit_is_made_on_its_median_session(monkeypatch):
    """A disturbed session (long delays, long steps) among the rounds is not what the fit is made on."""
    seen = []
    monkeypatch.setattr(HostCost, "fit_gap_model", lambda self, traced: seen.append(traced))
    sessions = ProbeSessions({2: HostCost.fit(2, [[10, 100, 0.01, 0.001], [20, 1000, 0.1, 0.002],
                                                  [30, 3000, 0.3, 0.003]])}, [], [(2, "ws")])
    results = [_result(5e-6, 0.05), _result(1.0e-6, 0.01), _result(1.1e-6, 0.011)]
    for r, res in enumerate(results):
        res[2].append(("graph", f"trace of session {r + 1}"))
        sessions.by_key[round_key(probe_key(2, "ws"), r)].result = res
    fits, _ = sessions.fit(cpu_machine(n_workers=2), None)
    assert seen == [[("graph", "trace of session 3")]]  # the median delay: 1.1 us
    assert fits[probe_key(2, "ws")].points == results[2][0]
