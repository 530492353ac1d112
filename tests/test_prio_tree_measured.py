"""prio's cost per tree level is measured on StarPU on queues of known length and charged as measured, not
fitted on its probe steps (tilecast.loop.host_cost.set_measured_tree, host-cost format 32)."""

import pytest
from sim_machines import cpu_machine

from tilecast.loop.host_cost import HostCost, ProbeSessions, probe_key, set_measured_tree, tree_key
from tilecast.loop.probe_rounds import ROUNDS, round_key
from tilecast.loop.queue_probe import extra_levels, level_cost


def _session(delay: float, makespan: float = 0.01):
    """A probe session's result as measure_probes gives it (as in tests/test_probe_rounds.py)."""
    return [[10, 100, makespan, 0.001], [20, 1000, 10 * makespan, 0.002]], [[1000.0, delay], [2000.0, delay]], [], 1e-6


def _tree_rows(level_s: float, workers: int = 2):
    """queue_probe.measure's rows where each extra level searched costs ``level_s``."""
    return [{"tasks": n, "workers": workers, "equal_s": 1e-6 * n, "distinct_s": 1e-6 * n + level_s * extra_levels(n),
             "extra_levels": extra_levels(n)} for n in (1024, 4096, 16384)]


def test_the_level_cost_is_the_makespans_difference_per_extra_level():
    assert level_cost(_tree_rows(6.75e-8)) == pytest.approx(6.75e-8, rel=1e-9)
    assert level_cost(_tree_rows(-1e-9)) == 0.0  # distinct priorities no dearer: nothing charged


def test_prio_is_measured_on_queues_of_known_length_for_each_worker_count():
    sessions = ProbeSessions({}, [], [(1, "prio"), (2, "prio"), (2, "ws")])
    assert tree_key(1) in sessions.by_key and tree_key(2) in sessions.by_key
    assert sessions.by_key[tree_key(2)].what == "prio's tree on queues of known length (2 workers)"
    assert sum(k.startswith("tree:") for k in sessions.by_key) == 2  # none for ws


def test_the_measured_level_is_charged_and_the_probes_do_not_refit_it(monkeypatch):
    """prio's fit takes the measured cost per level, whatever its probe sessions' makespans, and eager's cost
    between tasks (the same central queue without the tree)."""
    monkeypatch.setattr(HostCost, "fit_gap_model", lambda self, traced: None)
    base = HostCost.fit(2, [[10, 100, 0.01, 0.001], [20, 1000, 0.1, 0.002], [30, 3000, 0.3, 0.003]])
    base.task_overhead_s = 2.2e-6
    sessions = ProbeSessions({2: base}, [], [(2, "prio")])
    for r in range(ROUNDS):  # prio's probes 3x slower than eager's: a fit on them would charge a dear tree
        sessions.by_key[round_key(probe_key(2, "prio"), r)].result = _session(3e-6, 0.03)
    sessions.by_key[tree_key(2)].result = _tree_rows(6.75e-8)
    fits, _ = sessions.fit(cpu_machine(n_workers=2), None)
    prio = fits[probe_key(2, "prio")]
    assert prio.push_walk_s == pytest.approx(6.75e-8, rel=1e-9) and prio.walk_step_s == prio.push_walk_s


def test_set_measured_tree_takes_the_companions_cost_between_tasks():
    probe = HostCost.fit(1, [[10, 100, 0.01, 0.001], [20, 1000, 0.1, 0.002], [30, 3000, 0.3, 0.003]])
    probe.task_overhead_s, probe.push_walk_s = 3.0e-6, 5.1e-7  # as a fit on disturbed probes left it
    eager = HostCost.fit(1, [[10, 100, 0.01, 0.001], [20, 1000, 0.1, 0.002], [30, 3000, 0.3, 0.003]])
    eager.task_overhead_s = 1.6e-6
    set_measured_tree(probe, eager, 2.8e-8)
    assert probe.task_overhead_s == 1.6e-6 and probe.gap_costs[:5] == eager.gap_costs[:5]
    assert probe.push_walk_s == 2.8e-8
    set_measured_tree(probe, None, -1e-9)  # no companion stored: its own cost between tasks stays
    assert probe.task_overhead_s == 1.6e-6 and probe.push_walk_s == 0.0
