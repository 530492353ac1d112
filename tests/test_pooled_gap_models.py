"""The policies whose pushes and pops cost the same share one cost between tasks (host_cost.pool_gap_models)."""

import pytest
from sim_machines import cpu_machine

from tilecast.loop.host_cost import POOLED, HostCost, ProbeSessions, pool_gap_models, probe_key
from tilecast.loop.probe_rounds import ROUNDS, round_key

POINTS = [[10, 100, 0.01, 0.001], [20, 1000, 0.1, 0.002], [30, 3000, 0.3, 0.003]]


def _fit(overhead: float, gaps) -> HostCost:
    h = HostCost.fit(2, POINTS)
    h.task_overhead_s = overhead
    h.set_gap_costs(gaps)
    return h


def test_eager_and_the_members_take_their_mean_and_keep_their_own():
    eager = _fit(1e-6, (100e-9, 0.0, 50e-9, 300e-9, 600e-9))
    ws = _fit(2e-6, (40e-9, 20e-9, 50e-9, 600e-9, 300e-9))
    lws = _fit(0.3e-6, (160e-9, 40e-9, 50e-9, 0.0, 0.0))
    pool_gap_models(eager, [ws, lws])
    for m in (eager, ws, lws):
        assert m.task_overhead_s == pytest.approx(1.1e-6)
        assert m.gap_costs[:5] == pytest.approx((100e-9, 20e-9, 50e-9, 300e-9, 300e-9))
    assert ws.own_gap == pytest.approx([2e-6, 40e-9, 20e-9, 50e-9, 600e-9, 300e-9])
    assert lws.own_gap[0] == pytest.approx(0.3e-6)
    assert eager.own_gap == pytest.approx([1e-6, 100e-9, 0.0, 50e-9, 300e-9, 600e-9])


def test_pooling_again_counts_each_fit_by_its_own():
    """A later calibration that measures one policy again pools with the others' own models, not with the mean
    they were given."""
    eager = _fit(1e-6, (100e-9, 0.0, 0.0, 0.0, 0.0))
    ws = _fit(2e-6, (100e-9, 0.0, 0.0, 0.0, 0.0))
    pool_gap_models(eager, [ws])
    assert eager.task_overhead_s == pytest.approx(1.5e-6)
    lws = _fit(3e-6, (100e-9, 0.0, 0.0, 0.0, 0.0))
    pool_gap_models(eager, [ws, lws])
    assert eager.task_overhead_s == pytest.approx(2e-6) and ws.task_overhead_s == pytest.approx(2e-6)
    assert eager.own_gap[0] == pytest.approx(1e-6) and ws.own_gap[0] == pytest.approx(2e-6)


def test_the_mean_charges_what_the_members_charge_on_average():
    """The cost between tasks is linear in its coefficients: the pooled model's charge for any task is the mean of
    the members' charges."""
    a = _fit(1e-6, (100e-9, 10e-9, 20e-9, 300e-9, 0.0))
    b = _fit(3e-6, (300e-9, 30e-9, 60e-9, 100e-9, 500e-9))

    def charge(h, start_buffers=3, end_buffers=2, successors=4, ready=1, handoff=1):
        s, e, succ, r, hand = h.gap_costs[:5]
        return (h.task_overhead_s + s * start_buffers + e * end_buffers + succ * successors + r * ready
                + hand * handoff)

    expected = (charge(a) + charge(b)) / 2
    pool_gap_models(None, [a, b])
    assert charge(a) == pytest.approx(expected) and charge(b) == pytest.approx(expected)


def test_nothing_to_pool_leaves_a_fit_alone():
    ws = _fit(2e-6, (40e-9, 0.0, 0.0, 0.0, 0.0))
    pool_gap_models(None, [ws])  # alone
    assert ws.task_overhead_s == 2e-6 and ws.own_gap == []
    unmeasured = HostCost.fit(2, POINTS)  # no cost between tasks fitted: not a member
    pool_gap_models(unmeasured, [ws])
    assert ws.task_overhead_s == 2e-6 and ws.own_gap == []


def test_calibration_pools_the_same_cost_policies_and_not_dm(monkeypatch):
    """ProbeSessions.fit: eager, ws and lws take the mean of theirs; dm (a fitness loop over the workers on every
    push) keeps its own."""
    own = {"ws": 2e-6, "lws": 0.5e-6, "dm": 5e-6}

    def fake_gap_model(self, traced):
        self.task_overhead_s = own[traced[0][0]]
        self.set_gap_costs((10e-9, 0.0, 0.0, 0.0, 0.0))

    monkeypatch.setattr(HostCost, "fit_gap_model", fake_gap_model)
    assert "ws" in POOLED and "lws" in POOLED and "dm" not in POOLED
    eager = _fit(0.9e-6, (10e-9, 0.0, 0.0, 0.0, 0.0))
    todo = [(2, "ws"), (2, "lws"), (2, "dm")]
    sessions = ProbeSessions({2: eager}, [], todo)
    for _, sched in todo:
        for r in range(ROUNDS):
            sessions.by_key[round_key(probe_key(2, sched), r)].result = (
                POINTS, [[1000.0, 1e-6]], [(sched, "trace")], 1e-6)
    fits, _ = sessions.fit(cpu_machine(n_workers=2), None)
    mean = (0.9e-6 + 2e-6 + 0.5e-6) / 3
    assert fits[probe_key(2, "ws")].task_overhead_s == pytest.approx(mean)
    assert fits[probe_key(2, "lws")].task_overhead_s == pytest.approx(mean)
    assert fits[probe_key(2, "ws")].own_gap[0] == pytest.approx(2e-6)
    assert fits[probe_key(2, "dm")].task_overhead_s == pytest.approx(5e-6)
    assert fits[probe_key(2, "dm")].own_gap == []
    assert fits[2].task_overhead_s == pytest.approx(mean) and fits[2].own_gap[0] == pytest.approx(0.9e-6)
