"""dmdasd's decision costs and the sorted queues' insertion cost: fitted from probe makespans, kept through what
runs teach, used by predict."""

import numpy as np
import pytest
from sim_graphs import random_graph
from sim_machines import cpu_machine

from tilecast.loop import host_cost
from tilecast.loop.decision_cost import fit_decision_cost
from tilecast.loop.host_cost import HostCost, probe_key
from tilecast.perfmodel import load_machine
from tilecast.simulator.engine import Engine
from tilecast.simulator.simulate import simulate


@pytest.fixture
def local(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    return load_machine("local").with_workers(2).with_task_overhead(8e-6)


@pytest.fixture
def reading(monkeypatch):
    """dmdasd as StarPU runs it without a declared priority range: each decision reads the queued tasks."""
    monkeypatch.setenv("TILECAST_PRIORITY_LEVELS", "0")


def test_the_fit_recovers_the_costs_that_made_the_makespans(local, probes, reading):
    """Makespans simulated with known costs are fitted back to those costs (the roofline's durations)."""
    truth = (1.3e-7, 9e-6)
    measured = [simulate(g, local.with_decision_cost(*truth), "dmdasd").makespan for g in probes]
    free = [simulate(g, local, "dmdasd").makespan for g in probes]
    assert min(m / f for m, f in zip(measured, free)) > 1.3  # the costs matter on these probes
    scan, lock = fit_decision_cost(local, None, probes, measured)
    fitted = [simulate(g, local.with_decision_cost(scan, lock), "dmdasd").makespan for g in probes]
    assert fitted == pytest.approx(measured, rel=0.03)
    assert scan == pytest.approx(truth[0], rel=0.25) and lock == pytest.approx(truth[1], rel=0.25)


def test_each_worker_count_keeps_its_own_reading_cost(local, probes, reading):
    """Makespans simulated on 1 and 2 workers with a dearer read on two (a queue the other worker writes) are
    fitted back to each count's own costs, not to one shared reading cost."""
    truth = {1: (6e-8, 4e-6), 2: (1.1e-7, 9e-6)}
    got = {}
    for w in (1, 2):
        m = local.with_workers(w)
        measured = [simulate(g, m.with_decision_cost(*truth[w]), "dmdasd").makespan for g in probes]
        got[w] = fit_decision_cost(m, None, probes, measured)
        fitted = [simulate(g, m.with_decision_cost(*got[w]), "dmdasd").makespan for g in probes]
        assert fitted == pytest.approx(measured, rel=0.04)
        assert got[w][0] == pytest.approx(truth[w][0], rel=0.25)
    assert got[2][0] > 1.4 * got[1][0]


def test_with_a_declared_range_a_decision_reads_no_queued_task(local, probes, monkeypatch):
    """tilecast declares dmdasd's priority range: the cost per queued task read changes nothing, in the
    Python loop and in C alike, and the fit recovers the cost per other worker with none per read."""
    from tilecast.graph.priorities import declared_range

    assert declared_range("dmdasd") is not None
    lock = 9e-6
    measured = [simulate(g, local.with_decision_cost(0.0, lock), "dmdasd").makespan for g in probes]
    dearer = [simulate(g, local.with_decision_cost(5e-7, lock), "dmdasd").makespan for g in probes]
    assert dearer == measured
    monkeypatch.setattr(Engine, "native_loop", False)
    python = [simulate(g, local.with_decision_cost(5e-7, lock), "dmdasd").makespan for g in probes]
    monkeypatch.setattr(Engine, "native_loop", True)
    assert python == pytest.approx(measured, rel=1e-9)
    free = [simulate(g, local, "dmdasd").makespan for g in probes]
    assert min(m / f for m, f in zip(measured, free)) > 1.1  # the cost per other worker matters on these probes
    scan, fitted = fit_decision_cost(local, None, probes, measured)
    assert scan == 0.0 and fitted == pytest.approx(lock, rel=0.25)


@pytest.mark.parametrize("native", [True, False])
def test_with_a_declared_range_decisions_do_not_wait_for_each_other(native, monkeypatch):
    """Reading one sum per worker takes no other worker's lock: a decision is the deciding thread's time only,
    so on two workers the decisions' cost adds less than when they run one at a time (the reading path, no
    range declared), and no task waits for another thread's decision."""
    monkeypatch.setattr(Engine, "native_loop", native)
    g = random_graph(np.random.default_rng(7), 3000, 600)
    d = np.random.default_rng(8).integers(5, 40, size=(1, g.n_tasks)) * 1e-6
    m = cpu_machine(n_workers=2, overhead_us=0.0)
    costly = m.with_decision_cost(0.0, 6e-6)
    base = simulate(g, m, "dmdasd", durations=d).makespan
    own = simulate(g, costly, "dmdasd", durations=d).makespan - base
    monkeypatch.setenv("TILECAST_PRIORITY_LEVELS", "0")
    serial = simulate(g, costly, "dmdasd", durations=d).makespan - simulate(g, m, "dmdasd", durations=d).makespan
    assert 0.0 < own < 0.8 * serial


def test_runs_refine_the_host_cost_but_keep_the_decisions(local):
    probe = HostCost.fit(2, [[100, 1200, 0.02, 0.001], [1000, 2300, 0.045, 0.002], [3000, 13000, 0.29, 0.004]],
                         overheads=[[60000, 30e-6]])
    probe.probe_points = 3
    probe.task_overhead_s, probe.decision_scan_s, probe.decision_lock_s = 9e-6, 1e-7, 1.2e-5
    fits = host_cost.learn_from_runs({2: probe, probe_key(2, "dmdasd"): probe, "2:dmdasd": probe},
                                     [(2, "dmdasd", 500, 8700, 0.28, 0.29, 40e-6)])
    learned = fits["2:dmdasd"]
    assert len(learned.points) == 4  # the run taught the host cost
    # its start delays (40 us, decisions included) are not taken as the per-task cost
    assert (learned.task_overhead_s, learned.decision_scan_s, learned.decision_lock_s) == (9e-6, 1e-7, 1.2e-5)
    host_cost.save_host_costs(local, fits)
    back = host_cost.load_host_costs(local)["2:dmdasd"]
    assert back.decides and back.decision_lock_s == pytest.approx(1.2e-5)


def test_predict_charges_the_decisions_of_dmdasd_only(local, reading):
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model
    from tilecast.loop.config import StepConfig
    from tilecast.loop.predict import predict

    probe = HostCost.fit(2, [[10, 10, 0.01, 0.001], [100, 100, 0.02, 0.002]], overheads=[[1000, 9e-6]])
    fits = {2: probe, "2:dmdasd": HostCost(**{**probe.__dict__, "decision_lock_s": 2e-5})}
    cfg = dict(model=load_model("gpt2-tiny"), batch=2, seq=32, tiling=Tiling.parse("32"), workers=2)
    decided = predict(StepConfig(sched="dmdasd", **cfg), local, None, fits)
    plain = predict(StepConfig(sched="dmdasd", **cfg), local, None, {2: probe})
    # without a declared priority range (``reading``) decisions run one at a time, each locking the other worker's
    # queue, each before its task starts (with one, each is its own thread's time only, and the bound below held
    # or not by the roofline this machine measured: 13.32 ms against 13.54 on a faster measurement)
    assert decided.makespan_s >= decided.tasks * 2e-5 * 0.999 and decided.makespan_s > plain.makespan_s
    # the simulator charges no other policy for its decisions
    fits["2:dmdas"] = fits["2:dmdasd"]
    assert (predict(StepConfig(sched="dmdas", **cfg), local, None, fits).makespan_s
            == predict(StepConfig(sched="dmdas", **cfg), local, None, {2: probe}).makespan_s)


def test_the_walk_fit_recovers_the_cost_that_made_the_makespans(probes, tmp_path, monkeypatch):
    """dmdas's probe makespans simulated with a known cost per task walked past are fitted back to it
    (1 worker: every released task is pushed by the worker that runs the next one)."""
    from tilecast.loop.decision_cost import fit_push_walk

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    one = load_machine("local").with_workers(1).with_task_overhead(4e-6)
    truth = 4e-8
    measured = [simulate(g, one.with_push_walk(truth), "dmdas").makespan for g in probes]
    free = [simulate(g, one, "dmdas").makespan for g in probes]
    assert max(m / f for m, f in zip(measured, free)) > 1.05  # the walks matter on these probes
    walk = fit_push_walk(one, None, probes, measured)
    assert walk == pytest.approx(truth, rel=0.2)
    # measured 30% slower than simulated under both policies: the ratio to dmda's makespans still gives it
    dmda = [1.3 * simulate(g, one, "dmda").makespan for g in probes]
    walk = fit_push_walk(one, None, probes, [1.3 * x for x in measured], beside=("dmda", dmda))
    assert walk == pytest.approx(truth, rel=0.2)


def test_predict_charges_the_walks_of_the_sorted_policies_only(local):
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model
    from tilecast.loop.config import StepConfig
    from tilecast.loop.predict import predict

    probe = HostCost.fit(2, [[10, 10, 0.01, 0.001], [100, 100, 0.02, 0.002]], overheads=[[1000, 9e-6]])
    walking = HostCost(**{**probe.__dict__, "push_walk_s": 1e-6})
    cfg = dict(model=load_model("gpt2-tiny"), batch=2, seq=32, tiling=Tiling.parse("32"), workers=2)
    for sched, charged in (("dmdas", True), ("dmdasd", True), ("prio", True), ("dmda", False), ("eager", False)):
        with_walk = predict(StepConfig(sched=sched, **cfg), local, None, {2: probe, f"2:{sched}": walking})
        without = predict(StepConfig(sched=sched, **cfg), local, None, {2: probe})
        assert (with_walk.makespan_s > without.makespan_s) == charged, sched
        if not charged:
            assert with_walk.makespan_s == without.makespan_s, sched


def test_runs_refine_the_host_cost_but_keep_the_walk(local):
    probe = HostCost.fit(1, [[100, 1200, 0.02, 0.001], [1000, 2300, 0.045, 0.002], [3000, 13000, 0.29, 0.004]],
                         overheads=[[60000, 30e-6]])
    probe.probe_points = 3
    probe.task_overhead_s, probe.push_walk_s = 4e-6, 3e-8
    fits = host_cost.learn_from_runs({1: probe, probe_key(1, "dmdas"): probe, "1:dmdas": probe},
                                     [(1, "dmdas", 500, 8700, 0.28, 0.29, 40e-6)])
    assert (fits["1:dmdas"].task_overhead_s, fits["1:dmdas"].push_walk_s) == (4e-6, 3e-8)


def _prio_probes(probes, truth_machine, base):
    """prio's probe makespans simulated on ``truth_machine``, and eager's beside them on ``base``."""
    return ([simulate(g, truth_machine, "prio").makespan for g in probes],
            ("eager", [simulate(g, base, "eager").makespan for g in probes]))


def test_sorting_keeps_a_walk_that_predicts_each_probe_from_the_others(local, probes):
    """prio's makespans made by a cost per tree level: fitted on any two probes it predicts the third, so it
    is kept over the policy's own cost per task, even one close to the probes' mean excess."""
    from tilecast.loop.decision_cost import fit_sorting

    base = local.with_task_overhead(2e-6)
    measured, beside = _prio_probes(probes, base.with_push_walk(1e-7), base)
    walk, overhead = fit_sorting(base, None, probes, measured, "prio", beside, own_overhead=2.7e-6)
    assert walk == pytest.approx(1e-7, rel=0.05) and overhead == 2e-6


def test_sorting_takes_the_policys_own_cost_when_the_walk_fits_the_probes_only_together(local, probes):
    """prio's makespans made by a flat cost per task, its own measured 0.3 us high: a walk fitted on all
    three probes reproduces them better than that cost (the rule before), but fitted on two it predicts the
    third worse, so the policy's own cost is taken, and no walk."""
    from tilecast.loop.decision_cost import _fit_walk, _held_out_misfit, _misfit, _probe_target, fit_sorting

    base = local.with_task_overhead(2e-6)
    measured, beside = _prio_probes(probes, base.with_task_overhead(3.5e-6), base)
    own = 3.8e-6
    durations, target = _probe_target(base, None, probes, measured, beside)
    walk, in_sample = _fit_walk(base, "prio", probes, durations, target)
    alone = _misfit(base.with_task_overhead(own).with_push_walk(0.0), "prio", probes, durations, target)
    assert walk > 0.0 and in_sample < alone < _held_out_misfit(base, "prio", probes, durations, target)
    assert fit_sorting(base, None, probes, measured, "prio", beside, own_overhead=own) == (0.0, own)
    assert _held_out_misfit(base, "prio", probes[:2], durations[:2], target[:2]) is None


@pytest.mark.parametrize("native", [True, False])
def test_a_worker_pays_its_decisions_after_its_release(native, monkeypatch, reading):
    """On one worker the costs between two tasks are paid by that worker's thread, one after the other: its
    release of the ended task's successors, then per successor the decision (dmdasd's reading of the queue;
    StarPU's _starpu_handle_job_termination pushes each successor through the policy). So the step grows by
    about the sum of what each adds alone (less the submitting thread's first decisions, which overlap the
    worker's first release), not by the larger of them."""
    monkeypatch.setattr(Engine, "native_loop", native)
    g = random_graph(np.random.default_rng(5), 600, 120)
    d = np.random.default_rng(6).integers(5, 40, size=(1, g.n_tasks)) * 1e-6
    m = cpu_machine(n_workers=1, overhead_us=0.0)
    release, decisions = m.with_gap_costs(0.0, 0.0, 4e-6), m.with_decision_cost(2e-7, 0.0)
    both = release.with_decision_cost(2e-7, 0.0)
    base = simulate(g, m, "dmdasd", durations=d).makespan
    alone = [simulate(g, x, "dmdasd", durations=d).makespan - base for x in (release, decisions)]
    assert min(alone) > 0.0
    together = simulate(g, both, "dmdasd", durations=d).makespan - base
    assert sum(alone) * 0.98 <= together <= sum(alone) * (1 + 1e-9)


def test_with_a_declared_range_calibration_charges_no_decision(local, probes, monkeypatch):
    """dmdasd's probe sessions made with a dear decision: with tilecast's declared priority range the fit charges
    none (a decision reads one sum per worker, its upkeep a few additions) and takes dmdas's per-task cost and
    walk; with no range declared (decisions read the queued tasks) it fits the costs on those sessions."""
    dear = 6e-6
    companion = HostCost.fit(2, [[100, 1000, mk, 1e-3] for mk in [simulate(g, local, "dmdas").makespan
                                                                   for g in probes]], overheads=[[1e5, 8e-6]])
    companion.probe_points = len(probes)
    companion.push_walk_s = 3e-8

    def probe_fit():
        made = [simulate(g, local.with_decision_cost(0.0, dear), "dmdasd").makespan for g in probes]
        fit = HostCost.fit(2, [[100, 1000, mk, 1e-3] for mk in made], overheads=[[1e5, 9e-6]])
        fit.probe_points = len(probes)
        fit.decision_lock_s = 1e-6  # a stored figure is not kept
        return fit

    declared = probe_fit()
    host_cost.fit_decisions(declared, local, None, companion, "dmdasd", probes)
    assert (declared.decision_scan_s, declared.decision_lock_s, declared.decides) == (0.0, 0.0, False)
    assert (declared.task_overhead_s, declared.push_walk_s) == (companion.task_overhead_s, 3e-8)
    monkeypatch.setenv("TILECAST_PRIORITY_LEVELS", "0")
    reading = probe_fit()
    host_cost.fit_decisions(reading, local, None, companion, "dmdasd", probes)
    assert reading.decides


def test_the_probe_sessions_pair_dmdas_alone():
    """dmdas beside dmda in alternated sessions, on each worker count; no pairs for dmdasd (nothing of its
    decisions is fitted with a declared range) nor for the other policies."""
    sessions = host_cost.ProbeSessions({}, [], [(1, "dmdas"), (1, "dmdasd"), (2, "dmdas"), (2, "dmdasd"),
                                                 (2, "prio"), (2, "eager")])
    assert sessions.by_key[host_cost.pairs_key(2, "dmdas")].what == "dmdas beside dmda, alternated (2 workers)"
    assert sessions.by_key[host_cost.pairs_key(1, "dmdas")].what == "dmdas beside dmda, alternated (1 worker)"
    assert not {host_cost.pairs_key(w, s) for w in (1, 2) for s in ("dmdasd", "prio", "eager")} & set(sessions.by_key)
