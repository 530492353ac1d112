"""QuietGuard: wait out slow spells, retake sessions they touched, report how every session fared."""

import importlib

import pytest

from tilecast.loop.interference import QuietGuard


class Clock:
    """A probe that returns the given times in turn, and a sleep that only counts."""

    def __init__(self, times):
        self.times = list(times)
        self.slept = 0.0

    def probe(self):
        return self.times.pop(0)

    def sleep(self, s):
        self.slept += s


def guard(times, **kw):
    c = Clock(times)
    kw.setdefault("reuse_s", 0.0)  # every session probed before and after (reuse has its own test)
    return QuietGuard(probe=c.probe, sleep=c.sleep, **kw), c


def test_a_sessions_closing_probe_opens_the_next_when_recent_and_quiet():
    now = [0.0]
    g, _ = guard([1.0, 1.02, 1.01, 1.3, 1.0, 1.0], reuse_s=5.0, clock=lambda: now[0])
    g.measure(lambda: None)  # probes 1.0, 1.02
    now[0] = 1.0
    _, info = g.measure(lambda: None)  # opened by 1.02 (1 s old, quiet); closed by 1.01
    assert info["probe_before_s"] == 1.02 and info["probe_after_s"] == 1.01 and len(g.probes) == 3
    now[0] = 10.0
    _, info = g.measure(lambda: None)  # 9 s old: probed afresh (1.3: waits), then 1.0 before, 1.0 after
    assert info["probe_before_s"] == 1.0 and g.waited_s > 0 and len(g.probes) == 6


def test_quiet_session_runs_once():
    g, c = guard([1.0, 1.05])
    runs = []
    result, info = g.measure(lambda: runs.append(1) or "r")
    assert result == "r" and len(runs) == 1 and info["retakes"] == 0 and c.slept == 0
    v = g.verdict(info)
    assert not v["disturbed"] and v["probe_after"] == pytest.approx(1.05)


def test_waits_for_a_slow_spell_to_pass_before_running():
    # fastest seen 1.0; then two slow probes (waited out), then quiet: run, quiet after
    g, c = guard([1.0, 1.3, 1.25, 1.02, 1.01], poll_s=0.5)
    g.check()  # the machine was seen at 1.0 once
    runs = []
    _, info = g.measure(lambda: runs.append(1))
    assert len(runs) == 1 and c.slept == pytest.approx(1.0) and g.waited_s == pytest.approx(1.0)
    assert info["probe_before_s"] == 1.02 and not g.verdict(info)["disturbed"]


def test_session_ending_in_a_spell_is_retaken():
    # before quiet, after slow -> retake; before quiet, after quiet -> kept
    g, _ = guard([1.0, 1.2, 1.0, 1.03])
    runs = []
    result, info = g.measure(lambda: runs.append(1) or len(runs))
    assert result == 2 and info["retakes"] == 1 and g.retaken == 1
    assert not g.verdict(info)["disturbed"]


def test_retakes_are_bounded_and_the_kept_session_is_marked_disturbed():
    g, _ = guard([1.0, 1.5] * 10, max_retakes=2, max_wait_s=0)
    runs = []
    _, info = g.measure(lambda: runs.append(1))
    # no waiting budget: measured at once, never retaken, reported as disturbed
    assert len(runs) == 1 and info["retakes"] == 0 and g.verdict(info)["disturbed"]
    g, _ = guard([1.0, 1.5, 1.0, 1.5, 1.0, 1.5, 1.0, 1.5], max_retakes=2)
    runs = []
    _, info = g.measure(lambda: runs.append(1))
    assert len(runs) == 3 and info["retakes"] == 2 and g.verdict(info)["disturbed"]


def test_waiting_budget_is_spent_then_sessions_run_anyway():
    g, c = guard([1.0] + [2.0] * 50, poll_s=1.0, max_wait_s=3.0)
    g.check()
    runs = []
    _, info = g.measure(lambda: runs.append(1))
    assert len(runs) == 1 and g.waited_s == pytest.approx(3.0) and c.slept == pytest.approx(3.0)
    assert g.verdict(info)["disturbed"] and g.summary()["waited_s"] == pytest.approx(3.0)


def test_verdict_uses_the_fastest_probe_of_the_whole_run():
    # the run began inside a spell: its first session looked quiet then, not once a faster probe was seen
    g, _ = guard([1.3, 1.3, 1.0, 1.0])
    _, first = g.measure(lambda: None)
    assert first["retakes"] == 0
    g.measure(lambda: None)
    v = g.verdict(first)
    assert v["disturbed"] and v["probe_before"] == pytest.approx(1.3)
    assert g.summary()["reference_best_s"] == 1.0 and g.summary()["reference_probes"] == 4


def test_execute_rows_report_sessions_with_a_guard(monkeypatch):
    """execute() runs each session through the guard and puts the verdicts in the rows."""
    ex = importlib.import_module("tilecast.loop.execute")  # the package exports a function of that name

    calls = []

    def fake_round(cfg, steps, warmup):
        calls.append(cfg)
        return ("round", cfg, steps)

    class M:
        median_s = 1.0
        graph = None

    monkeypatch.setattr(ex, "measure_round", fake_round)
    monkeypatch.setattr(ex, "measurement_of", lambda rounds, warmup: M())
    monkeypatch.setattr(ex, "predict", lambda cfg, *a, **k: type("P", (), {"config": cfg, "step_s": 1.0})())

    class Pred:
        def __init__(self, name):
            self.config = type("C", (), {"label": lambda self: name})()
            self.step_s = 1.0

    preds = [Pred("a"), Pred("b")]
    g, _ = guard([1.0, 1.0, 1.0, 1.4, 1.0, 1.0])  # a: quiet; b: after slow -> retaken, then quiet
    out = ex.execute(preds, preds, None, None, None, steps=1, min_timed_s=0, progress=False, guard=g)
    assert len(calls) == 3
    sessions = [c.sessions for c in out.checked]
    assert [len(s) for s in sessions] == [1, 1]
    assert sessions[1][0]["retakes"] == 1 and not any(s[0]["disturbed"] for s in sessions)
    assert out.quiet["sessions_retaken"] == 1


def test_execute_retakes_sessions_the_runs_fastest_reference_shows_disturbed(monkeypatch):
    """A run that began in a slow spell: its first session looked quiet then and is retaken at the end."""
    ex = importlib.import_module("tilecast.loop.execute")  # the package exports a function of that name

    calls = []

    class M:
        median_s = 1.0
        graph = None

    monkeypatch.setattr(ex, "measure_round", lambda cfg, steps, warmup: calls.append(cfg.name) or cfg.name)
    monkeypatch.setattr(ex, "measurement_of", lambda rounds, warmup: M())
    monkeypatch.setattr(ex, "predict", lambda cfg, *a, **k: type("P", (), {"config": cfg, "step_s": 1.0})())

    class Pred:
        def __init__(self, name, step_s):
            self.config = type("C", (), {"name": name, "label": lambda self: name})()
            self.step_s = step_s

    preds = [Pred("a", 1.0), Pred("b", 1.0), Pred("c", 10.0)]
    # a in a spell (1.3, 1.3: quiet by the standard then), b quiet at 1.0, c quiet; a is retaken at the end
    g, _ = guard([1.3, 1.3, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    out = ex.execute(preds, preds, None, None, None, steps=1, min_timed_s=0, progress=False, guard=g)
    assert calls == ["a", "b", "c", "a"]
    a, b, c = (c.sessions[0] for c in out.checked)
    assert a["retakes"] == 1 and not a["disturbed"] and b["retakes"] == 0 and c["retakes"] == 0
    assert out.quiet["sessions_retaken"] == 1


def test_recalibration_learns_from_the_quiet_sessions_only():
    from tilecast.loop.execute import quiet_rounds

    rounds = ["r0", "r1", "r2"]
    sessions = [{"disturbed": False}, {"disturbed": True}, {"disturbed": False}]
    assert quiet_rounds(rounds, sessions) == ["r0", "r2"]
    assert quiet_rounds(rounds, None) == rounds  # unchecked: all
    assert quiet_rounds(rounds, [{"disturbed": True}] * 3) == rounds  # none quiet: all rather than nothing


def test_configurations_of_one_task_graph_are_learned_from_together():
    from types import SimpleNamespace

    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model
    from tilecast.loop.config import StepConfig
    from tilecast.loop.execute import learning_groups

    tiny = load_model("gpt2-tiny")
    cfgs = [StepConfig(tiny, 2, 32, Tiling.parse(t), s, 2) for t, s in (("64", "eager"), ("256", "eager"),
                                                                         ("64", "dmda"))]
    assert cfgs[0].graph_key == cfgs[2].graph_key != cfgs[1].graph_key
    learned = [SimpleNamespace(graph=f"g{i}", traces=[f"t{i}a", f"t{i}b"]) for i in range(3)]
    groups = learning_groups(cfgs, learned)
    # one group per graph, in the order first measured; a later scheduler's steps join, never replace
    assert groups == [("g0", ["t0a", "t0b", "t2a", "t2b"], 2), ("g1", ["t1a", "t1b"], 2)]


def test_a_shared_budget_caps_each_wait_so_that_later_sessions_still_wait():
    """A budget of 10 s over 10 sessions, shared at twice the even share: the first session waits at most 2 s
    in a long slow spell, its retakes included (then runs, reported disturbed) and leaves 8 s; unshared, the
    same session took it all."""
    slow = [1.0] + [1.3] * 30 + [1.0] * 5
    g, c = guard(slow, poll_s=0.5, max_wait_s=10.0)
    g.check()
    g.share_budget(10)
    assert g.session_wait_s == pytest.approx(2.0)
    _, info = g.measure(lambda: None)
    assert g.verdict(info)["disturbed"] and info["retakes"] == 0  # no retake once its share is waited
    assert c.slept == pytest.approx(2.0) and g.budget_left_s == pytest.approx(8.0)
    g.share_budget(9)  # 8 s left for 9 sessions
    assert g.session_wait_s == pytest.approx(2 * 8.0 / 9)
    g.share_budget(1)
    assert g.session_wait_s == pytest.approx(16.0)  # the last session may wait for all that is left, and more
    whole, c2 = guard(slow, poll_s=0.5, max_wait_s=10.0)
    whole.check()
    whole.measure(lambda: None)
    assert c2.slept == pytest.approx(10.0) and whole.budget_left_s == 0.0


def test_measuring_sessions_shares_the_budget_over_the_sessions_left(monkeypatch):
    """execute's session loop shares the budget before each session: the caps it set, in order, are twice the
    budget left over the sessions left."""
    ex = importlib.import_module("tilecast.loop.execute")

    caps = []
    g, _ = guard([1.0] * 40, max_wait_s=6.0)
    real = g.share_budget
    monkeypatch.setattr(g, "share_budget", lambda n: (real(n), caps.append((n, g.session_wait_s))))
    monkeypatch.setattr(ex, "measure_round", lambda cfg, n, warmup: ([0.1] * n, [0.1] * n, None))

    class P:
        class config:
            @staticmethod
            def label():
                return "a configuration"

    ex._measure_sessions([P(), P()], [[3, 3], [3]], 1, g, progress=False)
    assert [n for n, _ in caps] == [3, 2, 1] and [c for _, c in caps] == pytest.approx([4.0, 6.0, 12.0])
