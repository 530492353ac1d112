"""Measure only while the machine runs at its usual speed: a reference step timed around every session.

On the 2-core development VM, a gpt2-tiny step (32 x 128, tile 64, eager,
both cores) ran at 35-37 ms, then for spells of 3-15 s at 43-49 ms, several
times a minute, in separate StarPU sessions alike and at no fixed time after
the load began (over 150 s: 20 of 156 sessions fell in a spell). In the
spells, the memory-heavy kernels slowed and the compute-bound ones hardly:
softmax_apply 1.9 -> 3.8 ms per step, attn_qk +20%, GEMM +12%,
softmax_stats and GELU unchanged. Nothing single-core saw them: the same
step on one worker, timed just before and after each two-worker session,
took 67.6 ms outside the spells and 69.7 ms in them (+3%); in-L2 matrix products, an
L3-sized copy and a page-writing loop in the main thread were unchanged
too (and the copy had slow spells of its own, at other times, that the step
did not feel). Not the cores' own speed, then, but something only two busy
cores feel (most likely how the host places the virtual cores); its cause
is outside the VM.

A session measured in a spell says nothing about a model's accuracy, and it
wrongs a comparison of configurations measured at different times. The
probe that tells is the thing it affects: :func:`reference_step` runs the
small step above on every worker (a StarPU session of one warm-up and three
timed steps, about 0.3 s) and keeps its fastest step. :class:`QuietGuard`
runs it before and after each measured session; a session with either
probe more than ``threshold`` slower than the fastest probe seen is
retaken once the probe is fast again (within a waiting budget), and every
row reports how its sessions fared. Long sessions are retaken too: in
runs with many spells, the 20 s sessions of 2.6-3.2 s steps measured 7-13%
slow when the references around them were (1.28-1.37x). The reference
step's fastest of three varied by 7% outside spells (34.0-36.4 ms) and was
42-47 ms inside them, hence the 12%.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

REFERENCE = ("gpt2-tiny", 32, 128, "64", "eager")  # model, batch, seq, tiling, scheduler
REFERENCE_STEPS = 3
SHARE_FACTOR = 2.0  # QuietGuard.share_budget: a session may wait this many times its even share of the budget


def reference_config(workers: int):
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model
    from tilecast.loop.config import StepConfig

    name, batch, seq, tile, sched = REFERENCE
    return StepConfig(load_model(name), batch, seq, Tiling.parse(tile), sched, workers)


def reference_step(workers: int) -> float:
    """The fastest of a few reference steps on ``workers`` StarPU workers (seconds; own session, one warm-up)."""
    from tilecast.loop.measure import measure_round

    steps, _, _ = measure_round(reference_config(workers), REFERENCE_STEPS, 1, traced=1)  # no trace is used
    return float(min(steps[1:]))


@dataclass
class QuietGuard:
    """Decides whether the machine runs at its usual speed, waits for it if not, and keeps count.

    ``probe()`` gives a time that the disturbance lengthens (by default the
    reference step on ``workers``); a probe more than ``threshold`` slower
    than the fastest seen means disturbed. ``max_wait_s`` bounds the
    waiting in all, after which sessions are measured whatever the probe says
    (and reported as disturbed). ``probe`` and ``sleep`` are injectable.
    """

    workers: int = 1
    threshold: float = 0.12
    max_wait_s: float = 120.0
    poll_s: float = 1.0
    max_retakes: int = 2
    reuse_s: float = 5.0  # a quiet probe taken this recently (the last session's closing one) opens the next
    session_wait_s: float = float("inf")  # the most one session waits for quiet, retakes included (share_budget)
    probe: object = None
    sleep: object = time.sleep
    best_s: float = float("inf")
    waited_s: float = 0.0
    retaken: int = 0
    probes: list = field(default_factory=list)
    clock: object = time.monotonic
    _last: tuple | None = None  # (probe s, when) of the latest probe

    def _probe(self) -> float:
        return float(self.probe()) if self.probe is not None else reference_step(self.workers)

    def check(self) -> float:
        """Probe now; the probe's time (also kept, and the fastest seen updated)."""
        t = self._probe()
        self.best_s = min(self.best_s, t)
        self.probes.append(t)
        self._last = (t, self.clock())
        return t

    def disturbed(self, probe_s: float) -> bool:
        """Whether a probe of ``probe_s`` was over the threshold, judged by the fastest probe seen so far."""
        return probe_s > (1.0 + self.threshold) * self.best_s

    @property
    def budget_left_s(self) -> float:
        return max(0.0, self.max_wait_s - self.waited_s)

    def wait_until_quiet(self, limit_s: float = float("inf")) -> float:
        """Probe until the machine is quiet, the waiting budget is spent or ``limit_s`` seconds were waited;
        the last probe's time. A quiet probe taken within ``reuse_s`` (the previous session's closing probe)
        counts without probing again."""
        if self._last is not None and self.clock() - self._last[1] <= self.reuse_s and not self.disturbed(
                self._last[0]):
            return self._last[0]
        t = self.check()
        waited = 0.0
        while self.disturbed(t) and self.budget_left_s > 0 and waited < limit_s:
            pause = min(self.poll_s, self.budget_left_s)
            self.sleep(pause)
            self.waited_s += pause
            waited += pause
            t = self.check()
        return t

    def share_budget(self, sessions_left: int, factor: float = SHARE_FACTOR) -> None:
        """Let the next sessions wait for quiet (their retakes included) at most ``factor`` times the waiting budget
        left per session still to measure (and at least one poll): the budget then lasts the whole run. Spent on
        the first sessions, it left every later one measured in whatever spell it met: in accuracy runs 13-15
        (2026-12-01) the 240 s were gone within the first of eight blocks of sessions, whose sessions then ran
        7-8% faster than their configurations' medians (docs/accuracy.md)."""
        self.session_wait_s = max(self.poll_s, factor * self.budget_left_s / max(sessions_left, 1))

    def measure(self, run):
        """``run()`` in a quiet spell: wait for one, run, probe again; retake a run that ended disturbed
        (at most ``max_retakes`` times, while waiting budget is left).

        Returns ``(result, info)``: ``info`` has the probes before and after
        the kept run (seconds) and ``retakes``; :meth:`verdict` tells whether
        they were disturbed.
        """
        retakes = 0
        start = self.waited_s
        while True:
            before = self.wait_until_quiet(self.session_wait_s - (self.waited_s - start))
            result = run()
            after = self.check()
            if not (self.disturbed(before) or self.disturbed(after)) or retakes >= self.max_retakes \
                    or self.budget_left_s <= 0 or self.waited_s - start >= self.session_wait_s:
                return result, {"probe_before_s": before, "probe_after_s": after, "retakes": retakes}
            retakes += 1
            self.retaken += 1

    def verdict(self, info: dict) -> dict:
        """``info`` judged by the fastest probe of the whole run (a late fast probe can show that an early
        session, quiet by the standard of its time, was not): adds ratios and ``disturbed``."""
        before, after = info["probe_before_s"] / self.best_s, info["probe_after_s"] / self.best_s
        return {**info, "probe_before": before, "probe_after": after,
                "disturbed": max(before, after) > 1.0 + self.threshold}

    def settle(self, probes: int) -> float:
        """Probe ``probes`` times in a row before anything is measured, so that the standard starts from the
        machine's fast state where one of them finds it; the fastest seen."""
        for _ in range(probes):
            self.check()
        return self.best_s

    def summary(self) -> dict:
        return {"reference": " ".join(str(x) for x in REFERENCE), "reference_best_s": self.best_s if self.probes
                else None, "reference_probes": len(self.probes), "waited_s": self.waited_s,
                "sessions_retaken": self.retaken, "quiet_threshold": self.threshold}


@dataclass
class GuardedPass:
    """One timing pass (a StarPU session of a calibration) taken under a :class:`QuietGuard`: its result, the
    probes around it (``info``, :meth:`QuietGuard.measure`'s) and how to take it again (``run``)."""

    what: str
    run: object
    result: object = None
    info: dict | None = None
    late: int = 0  # times taken again after the fact (retake_disturbed)

    def take(self, guard) -> object:
        if guard is None:
            self.result = self.run()
            return self.result
        self.result, info = guard.measure(self.run)
        if self.info is not None:  # a retake: the count goes on
            info["retakes"] += self.info["retakes"] + 1
        self.info = info
        return self.result


def retake_disturbed(passes, guard: QuietGuard, budget_s: float, wait_s: float = 0.0) -> dict:
    """Take again, in the order they were taken, the ``passes`` that the guard's standard now (the fastest
    reference of the whole run) shows disturbed, though they looked quiet by the standard of their time.

    Retaking stops once ``budget_s`` seconds (on the guard's clock) have gone, or when a retake came out
    disturbed again with no waiting left (the machine stays slow: more retakes would time it as slow); the
    guard may wait ``wait_s`` seconds more, in all, for slow spells to pass (its own budget may be spent by
    then). Returns counts:
    passes, disturbed (before), retaken, still_disturbed (after), and the seconds spent.
    """
    passes = [p for p in passes if p.info is not None]
    todo = [p for p in passes if guard.verdict(p.info)["disturbed"]]
    guard.max_wait_s = max(guard.max_wait_s, guard.waited_s + wait_s)
    start = guard.clock()
    retaken = 0
    for p in todo:
        if guard.clock() - start >= budget_s:
            break
        p.take(guard)
        p.late += 1
        retaken += 1
        if guard.verdict(p.info)["disturbed"] and guard.budget_left_s <= 0:
            break
    return {"passes": len(passes), "disturbed": len(todo), "retaken": retaken,
            "still_disturbed": sum(guard.verdict(p.info)["disturbed"] for p in passes),
            "seconds": guard.clock() - start}


def probe_times(passes) -> list:
    """The reference steps taken around ``passes`` (before and after each kept take; seconds)."""
    return [v for p in passes if p.info is not None for v in (p.info["probe_before_s"], p.info["probe_after_s"])]


def reference_of(passes) -> float | None:
    """The median reference step around ``passes`` (:func:`probe_times`): the machine's speed while they were
    timed. None without probes."""
    import numpy as np

    t = probe_times(passes)
    return float(np.median(t)) if t else None


def reference_note(calibrated_s: float | None, now_s: float | None, threshold: float = 0.12) -> str | None:
    """One line when the reference step now (``now_s``) differs from the one the calibration was timed at by
    more than ``threshold``: the forecast then carries that difference in the machine's speed. None otherwise."""
    if not calibrated_s or not now_s:
        return None
    r = now_s / calibrated_s
    if abs(r - 1.0) <= threshold:
        return None
    return (f"note: the reference step runs {abs(r - 1.0):.0%} {'faster' if r < 1 else 'slower'} now "
            f"({now_s * 1e3:.1f} ms) than while the kernels were calibrated ({calibrated_s * 1e3:.1f} ms): "
            f"forecasts may be {'slow' if r < 1 else 'fast'} by about as much")
