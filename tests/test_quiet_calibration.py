"""Calibration judged by the measurement's standard: passes that a later, faster reference shows disturbed are
taken again, the figures set from the retake, and the accuracy suite runs calibration and measurement under
one quiet check (tilecast.loop.quiet_calibration)."""

from types import SimpleNamespace

import numpy as np
import pytest

from tilecast.loop.interference import GuardedPass, QuietGuard, reference_note, retake_disturbed


class Machine:
    """The machine's speed as the reference probe sees it (``speed``, set by the test, or ``speeds`` in turn);
    a timing pass takes its base time times the speed of the latest probe (a slow spell lengthens both alike)."""

    def __init__(self, speed=1.0, speeds=()):
        self.speed, self.speeds, self.now, self.t = speed, list(speeds), None, 0.0

    def probe(self):
        if self.speeds:
            self.speed = self.speeds.pop(0)
        self.now = self.speed
        return self.now

    def clock(self):
        self.t += 1.0
        return self.t


def make_guard(m, **kw):
    kw.setdefault("reuse_s", 0.0)
    return QuietGuard(probe=m.probe, sleep=lambda s: None, clock=m.clock, **kw)


def test_a_pass_quiet_by_its_own_standard_is_retaken_by_the_later_one():
    # calibration in a slow spell throughout (1.3: quiet by its own fastest), measurement fast (1.0)
    m = Machine(1.3)
    g = make_guard(m)
    passes = [GuardedPass(f"p{i}", lambda: m.now) for i in range(2)]
    for p in passes:
        p.take(g)
    assert [p.result for p in passes] == [1.3, 1.3] and not any(p.info["retakes"] for p in passes)
    m.speed = 1.0
    g.check()  # the measurement sees the fast state
    assert all(g.verdict(p.info)["disturbed"] for p in passes)
    out = retake_disturbed(passes, g, budget_s=100.0)
    assert out["disturbed"] == 2 and out["retaken"] == 2 and out["still_disturbed"] == 0
    assert [p.result for p in passes] == [1.0, 1.0] and [p.late for p in passes] == [1, 1]
    assert all(p.info["retakes"] == 1 for p in passes)


def test_retaking_is_bounded_by_its_budget_and_quiet_passes_stay():
    m = Machine(1.0)
    g = make_guard(m, max_wait_s=0.0)
    passes = [GuardedPass(f"p{i}", lambda: m.now) for i in range(3)]
    passes[0].take(g)  # quiet at 1.0
    m.speed = 1.3
    for p in passes[1:]:
        p.take(g)  # in a spell, no waiting budget: kept, disturbed
    assert [g.verdict(p.info)["disturbed"] for p in passes] == [False, True, True]
    m.speed = 1.0
    out = retake_disturbed(passes, g, budget_s=1.5)  # the clock moves a second per reading: time for one
    assert out == {**out, "disturbed": 2, "retaken": 1, "still_disturbed": 1}
    assert [p.late for p in passes] == [0, 1, 0] and passes[1].result == 1.0


def test_retaking_stops_when_the_machine_stays_slow_and_no_waiting_is_left():
    m = Machine(1.0)
    g = make_guard(m, max_wait_s=0.0)
    passes = [GuardedPass(f"p{i}", lambda: m.now) for i in range(4)]
    passes[0].take(g)
    m.speed = 1.3
    for p in passes[1:]:
        p.take(g)
    out = retake_disturbed(passes, g, budget_s=1e6)  # still 1.3: the first retake stays disturbed, then stop
    assert out["disturbed"] == 3 and out["retaken"] == 1 and out["still_disturbed"] == 3


def test_settle_finds_the_fast_state_before_anything_is_timed():
    m = Machine(speeds=[1.3, 1.25, 1.0, 1.3, 1.3, 1.0, 1.0])
    g = make_guard(m, poll_s=1.0)
    assert g.settle(3) == 1.0 and len(g.probes) == 3
    _, info = g.measure(lambda: None)  # 1.3 when it opens is a slow spell by then: waited out
    assert g.waited_s == 2.0 and info["probe_before_s"] == 1.0 and not g.verdict(info)["disturbed"]


def test_reference_note_only_past_the_threshold():
    assert reference_note(0.040, 0.042) is None
    assert reference_note(None, 0.04) is None
    note = reference_note(0.046, 0.038)
    assert note.startswith("note:") and "faster" in note and "\n" not in note
    assert "slower" in reference_note(0.036, 0.046)


def _fake_timing(monkeypatch, m, base):
    """StarPUTiming's passes without StarPU: each returns ``base`` times the machine's speed now."""
    from tilecast.loop import kernel_calibration as kc

    def fake_pass(self, what, n_workers, todo, reps, sched, near=False):
        idx = [next(j for j, x in enumerate(self.cases) if x is c) for c in todo]
        return GuardedPass(what, lambda: np.asarray([base[i] for i in idx]) * m.now)

    monkeypatch.setattr(kc.StarPUTiming, "_pass", fake_pass)
    return kc


def _cases():
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model
    from tilecast.graph.models import build_step
    from tilecast.perfmodel.calibration import cases_from_shapes
    from tilecast.perfmodel.shapes import graph_shapes

    g = build_step(load_model("gpt2-tiny"), 2, 32, Tiling.parse("32"))
    return cases_from_shapes(graph_shapes(g), per_kernel=1)


def test_a_kernel_pass_taken_in_a_slow_spell_is_retaken_and_its_figures_replaced(monkeypatch, tmp_path):
    """time_in_starpu under a guard whose standard a later probe lowers: the passes timed at 1.3 are retaken at
    1.0 and the calibration's points and hot times become the fast ones, in place (no duplicate points)."""
    from tilecast.loop.quiet_calibration import retake_calibration
    from tilecast.perfmodel import load_machine

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    m = Machine(1.3)
    cases = _cases()
    base = [1e-3 * (i + 1) for i in range(len(cases))]
    kc = _fake_timing(monkeypatch, m, base)
    g = make_guard(m)
    record = []
    machine = load_machine("local")
    cal, _ = kc.time_in_starpu(machine, None, cases, [4] * len(cases), 2, guard=g, record=record)
    name, row = cases[0]
    assert cal.points[name]["median_s"] == [pytest.approx(1.3e-3)]
    assert cal.quiet["passes_disturbed"] == 0 and cal.quiet["reference_s"] == pytest.approx(1.3)
    samples = {k: [list(r) for r in v] for k, v in cal.worker_samples.items()}
    assert samples and all(r[1] == pytest.approx(r[2]) for v in samples.values() for r in v)
    m.speed = 1.0
    g.check()  # the measurement: 1.0
    cal, host, report = retake_calibration(record, g, machine, cal, {}, budget_s=1e6)
    n = kc.STARPU_PASSES + kc.HOT_PASSES + kc.NEAR_PASSES + 2 * kc.WORKER_PASSES
    assert report["disturbed"] == report["passes"] == n and report["retaken"] == n
    assert report["still_disturbed"] == 0
    for (name, row), b in zip(cases, base):  # replaced, not added beside
        assert cal.points[name]["median_s"] == [pytest.approx(b)] and cal.hot[name]["median_s"] == [pytest.approx(b)]
        assert cal.near[name]["median_s"] == [pytest.approx(b)]
    # the worker samples replaced too: as many rows, each taken at 1.0 now
    assert {k: len(v) for k, v in cal.worker_samples.items()} == {k: len(v) for k, v in samples.items()}
    assert all(r[1] == pytest.approx(o[1] / 1.3) for k in samples for r, o in zip(cal.worker_samples[k], samples[k]))
    assert cal.quiet["reference_s"] == pytest.approx(1.0) and cal.quiet["passes_retaken_late"] == n
    assert cal.quiet["reference_best_s"] == 1.0 and host == {}


def test_the_accuracy_suite_calibrates_and_measures_under_one_standard(monkeypatch, tmp_path):
    """run_suite: the host-cost probes, the kernel calibration and the measurement get the same guard; the
    calibration taken in a slow spell is retaken after the measurement showed the fast state, and first use is
    predicted from the retaken calibration (never from the suite's steps)."""
    import importlib

    import tilecast.loop.host_cost as hc
    import tilecast.loop.interference as itf
    import tilecast.loop.kernel_calibration as kc_mod
    from tilecast.loop import accuracy

    # the package exports functions of these modules' names
    ex_mod, pr = importlib.import_module("tilecast.loop.execute"), importlib.import_module("tilecast.loop.predict")
    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    # settle and calibration in a slow spell (1.3), the measurement in the fast state (1.0)
    m = Machine(1.3)
    monkeypatch.setattr(itf, "reference_step", lambda workers: m.probe())
    guards = []

    class Kernels:  # a calibration record: one pass, whose figure is the machine's speed when taken
        def __init__(self):
            self.pass_ = GuardedPass("kernels", lambda: m.now)

        @property
        def passes(self):
            return [self.pass_]

        def apply(self, cal):
            cal.value = self.pass_.result

    cal = SimpleNamespace(value=None, quiet={}, save=lambda *a: "cal.json", in_step_factor=1.0, in_step_hot=1.0,
                          in_step_byte_s=0.0, in_step_hot_span_s=0.0, in_step_source="")
    cal.calibrated_only = lambda: SimpleNamespace(value=cal.value)

    def fake_host(machine, workers, progress=True, scheds=(), guard=None, record=None):
        guards.append(guard)
        return {}

    def fake_cal(machine, graphs, progress=True, guard=None, record=None):
        guards.append(guard)
        k = Kernels()
        k.pass_.take(guard)
        k.apply(cal)
        record.append(k)
        return cal

    def predict_from(c, model):
        return SimpleNamespace(step_s=model.value, makespan_s=model.value, host_s=0.0, config=c)

    monkeypatch.setattr(hc, "ensure_host_costs", fake_host)
    monkeypatch.setattr(hc, "save_host_costs", lambda machine, fits: "host.json")
    monkeypatch.setattr(kc_mod, "ensure_calibration", fake_cal)
    monkeypatch.setattr(accuracy, "_predict_all", lambda configs, machine, c0, h0, graphs, progress, desc:
                        [predict_from(c, c0) for c in configs])
    monkeypatch.setattr(pr, "predict", lambda c, machine, c0, h0, graph=None, **k: predict_from(c, c0))
    monkeypatch.setattr(ex_mod, "learn_from_measurements", lambda configs, learned, machine, c0, h0: (c0, h0))

    def fake_execute(first, ranking, machine, c0, h0, steps, warmup, recalibrate, progress, guard, long_rounds,
                     groups):
        guards.append(guard)
        assert long_rounds == accuracy.LONG_ROUNDS  # long steps over two sessions
        assert groups == [c.model.name for c in accuracy.suite_configs("quick", [1], ["eager"])]  # by model shape
        m.speed = 1.0  # the machine in its fast state from now on
        checked = []
        for p in first:
            _, info = guard.measure(lambda: None)
            row = {"model": p.config.model.name, "pred_step_s": p.step_s, "real_step_s": 1.0}
            checked.append(SimpleNamespace(prediction=p, measurement=SimpleNamespace(median_s=1.0, graph=None),
                                           sessions=[guard.verdict(info)], after=predict_from(p.config, c0),
                                           row=lambda row=row: dict(row)))
        return SimpleNamespace(checked=checked, learned=[None] * len(first), quiet=guard.summary())

    monkeypatch.setattr(ex_mod, "execute", fake_execute)
    res = accuracy.run_suite("quick", workers=[1], policies=["eager"], progress=False)
    assert len(guards) == 3 and guards[0] is guards[1] is guards[2] is not None
    r = res.conditions["references"]
    assert r["calibration_passes"]["retaken"] == 1 and r["calibration_passes"]["still_disturbed"] == 0
    assert r["calibration_s"] == pytest.approx(1.0) and r["measurement_s"] == pytest.approx(1.0)
    assert r["standard_s"] == 1.0 and "reference_note" not in res.conditions
    # first use from the retaken calibration: timed at 1.0, as the steps were measured
    assert all(row["pred_first_use_s"] == pytest.approx(1.0) for row in res.rows)
    assert all(row["pred_step_s"] == pytest.approx(1.0) for row in res.rows)
    assert res.figures["first_use"]["bias"] == pytest.approx(0.0)


def test_probe_sessions_disturbed_by_the_runs_standard_are_refitted(monkeypatch, tmp_path):
    """The executor's probe sessions of a calibration taken in a slow spell: retaken, and the host-cost fits made
    again from the retake (the fits stored before them kept as they were)."""
    from tilecast.loop import host_cost as hc
    from tilecast.loop.probe_rounds import ROUNDS, round_key
    from tilecast.loop.quiet_calibration import retake_calibration

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    saved = []
    monkeypatch.setattr(hc, "save_host_costs", lambda machine, fits: saved.append(dict(fits)) or "host.json")
    monkeypatch.setattr(hc.ProbeSessions, "fit", lambda self, machine, cal: (
        {**self.base, **{k: ("fit", p.result) for k, p in self.by_key.items()}}, cal))
    m = Machine(1.3)
    g = make_guard(m)
    sessions = hc.ProbeSessions({2: "stored"}, [1], [(1, "prio")])
    for p in sessions.passes:
        p.run = lambda: m.now  # a probe session's result: the machine's speed when it ran
        p.take(g)
    host, cal = sessions.fit(None, None)
    assert host[1] == ("fit", 1.3)
    m.speed = 1.0
    g.check()
    cal = SimpleNamespace(quiet={}, save=lambda *a: "cal.json", in_step_factor=1.0, in_step_hot=1.0,
                          in_step_byte_s=0.0, in_step_hot_span_s=0.0, in_step_source="")
    _, host, report = retake_calibration([sessions], g, None, cal, host, budget_s=1e6)
    prio = [round_key(hc.probe_key(1, "prio"), r) for r in range(ROUNDS)]  # its sessions (tilecast.loop.probe_rounds)
    assert report["retaken"] == 3 + ROUNDS and report["still_disturbed"] == 0
    assert host == {2: "stored", 1: ("fit", 1.0), **{k: ("fit", 1.0) for k in prio}, hc.tree_key(1): ("fit", 1.0),
                    hc.STEP_GAPS_KEY: ("fit", 1.0)} and saved[-1] == host
    sessions_of_prio = [f"executor probes (prio, 1 worker, session {r + 1} of {ROUNDS})" for r in range(ROUNDS)]
    assert report["retaken_what"] == ["executor probes (1 worker)", sessions_of_prio[0],
                                      "prio's tree on queues of known length (1 worker)", *sessions_of_prio[1:],
                                      "the step probe's gaps (eager, 1 worker)"]


def test_first_use_takes_the_mean_of_the_probe_while_calibrating_and_the_one_after(monkeypatch, tmp_path):
    """The step probe is taken again after the measurement; the forecast's terms are the mean of both probes'
    (the steps ran between them), the report keeps each, and a probe that could not be fitted is not averaged."""
    from tilecast.loop import accuracy, step_probe
    from tilecast.loop.quiet_calibration import retake_calibration

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))

    def probe_again(machine, cal, guard=None):
        cal.in_step_hot, cal.in_step_factor, cal.in_step_byte_s, cal.in_step_hot_span_s = 1.1, 0.5, 2e-11, 4e-4
        cal.in_step_source = "measured: the second probe"
        return {}

    monkeypatch.setattr(step_probe, "take_step_probe", probe_again)
    g = make_guard(Machine(1.0))
    cal = SimpleNamespace(quiet={}, save=lambda *a: "cal.json", in_step_factor=0.9, in_step_hot=0.95,
                          in_step_byte_s=1e-11, in_step_hot_span_s=3e-4, in_step_source="measured: the first probe")
    cal, _, report = retake_calibration([], g, None, cal, {}, budget_s=1e6)
    assert (cal.in_step_hot, cal.in_step_factor, cal.in_step_byte_s) == pytest.approx((1.025, 0.7, 1.5e-11))
    assert cal.in_step_hot_span_s == 4e-4  # the later probe's, read from the lanes the forecast takes
    assert "the mean of two probes" in cal.in_step_source and "the first probe" in cal.in_step_source
    assert "the second probe" in cal.in_step_source and cal.in_step_source.startswith("measured:")
    f = report["in_step_factor"]
    assert (f["hot_calibration"], f["hot_now"], f["hot_used"]) == pytest.approx((0.95, 1.1, 1.025))
    assert (f["calibration"], f["now"], f["used"]) == pytest.approx((0.9, 0.5, 0.7))
    line = accuracy.retake_line({"disturbed": 0, "passes": 0, "retaken": 0, "seconds": 0.0, "still_disturbed": 0,
                                 "in_step_factor": f})
    assert "forecast with their mean, x1.025, x0.700 and 15.0 ps" in line
    cal = SimpleNamespace(quiet={}, save=lambda *a: "cal.json", in_step_factor=1.0, in_step_hot=1.0,
                          in_step_byte_s=0.0, in_step_hot_span_s=0.0, in_step_source="not measured: no lanes")
    cal, _, report = retake_calibration([], g, None, cal, {}, budget_s=1e6)
    assert (cal.in_step_hot, cal.in_step_factor, cal.in_step_byte_s) == (1.1, 0.5, 2e-11)  # the second alone


def test_the_reference_lines_for_people():
    from tilecast.cli.accuracy_cmd import references_line
    from tilecast.cli.calibrate_cmd import quiet_line

    line = quiet_line({"passes": 8, "passes_disturbed": 0, "passes_retaken": 2, "waited_s": 3.0,
                       "reference_best_s": 0.0309, "reference_s": 0.0321})
    assert "32.1 ms around the passes" in line and "30.9 ms" in line
    assert "reference step" not in quiet_line({"passes": 8, "passes_disturbed": 0, "passes_retaken": 0,
                                               "waited_s": 0.0, "reference_best_s": 0.03})  # an older calibration
    r = {"calibration_s": 0.0351, "calibration_best_s": 0.0309, "measurement_s": 0.0322, "measurement_best_s": 0.0308,
         "standard_s": 0.0308, "calibration_timed_in_this_run": True,
         "calibration_passes": {"passes": 20, "disturbed": 5, "retaken": 4, "still_disturbed": 1, "seconds": 80.0,
                                "retaken_what": []}}
    line = references_line(r)
    assert "calibration 35.1 ms (30.9 ms)" in line and "measurement 32.2 ms (30.8 ms)" in line
    assert "5 of 20 calibration passes disturbed, 4 retaken" in line
    stored = references_line({**r, "calibration_timed_in_this_run": False, "calibration_passes": None})
    assert "(stored)" in stored and "retaken" not in stored
