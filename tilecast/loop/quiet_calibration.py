"""Calibration judged by the standard of the measurement it is compared with.

The VM's speed moves by 15-20% between spells lasting minutes, and a
:class:`~tilecast.loop.interference.QuietGuard` judges a session by the
fastest reference step it has seen. A calibration with a guard of its own
is judged by the fastest reference of its own few minutes: taken in a slow
spell throughout, it looks quiet and times every kernel slow, and a
forecast from it is slow by as much against steps measured later in a fast
one (docs/accuracy.md, run 9: the suite measured 19% faster than the run
before while calibration timed the kernels 5% faster).

The accuracy suite therefore runs the host-cost probes, the kernel
calibration and the measurement under one guard, and once the measurement
has shown how fast the machine runs, :func:`retake_calibration` times again
the calibration passes that the run's fastest reference shows disturbed
(within a budget) and sets the calibration's figures from them. The passes
time calibration cases and probe steps only, never a step of the suite: a
forecast from them is still a first use.
"""

from __future__ import annotations

from tilecast.loop.interference import QuietGuard, probe_times, reference_of, retake_disturbed


def record_passes(record: list) -> list:
    """Every pass of ``record`` (the :class:`~tilecast.loop.kernel_calibration.StarPUTiming` and
    :class:`~tilecast.loop.host_cost.ProbeSessions` that calibration appended), in the order taken."""
    return [p for r in record for p in r.passes]


def retake_calibration(record: list, guard: QuietGuard, machine, cal, host: dict, budget_s: float,
                       wait_s: float = 0.0) -> tuple:
    """Retake the passes of ``record`` that ``guard``'s fastest reference now shows disturbed (at most
    ``budget_s`` seconds of retaking, ``wait_s`` more of waiting for slow spells) and set the calibration
    ``cal`` and the host-cost fits ``host`` from them again.

    Returns (calibration, host-cost fits, report): the report counts the
    passes, those disturbed by the run's standard before and after, the ones
    retaken, and gives the median reference around the passes kept
    (``reference_s``, the machine's speed while calibration timed) beside
    the standard (``reference_best_s``). The step probe is taken again too, in
    the state the steps ran in (:mod:`tilecast.loop.step_probe`; the report's
    ``in_step_factor``), and the forecast takes the mean of the two probes' terms
    (:func:`tilecast.loop.step_probe.mean_of_probes`).
    Both are saved when anything changed; ``cal.quiet`` keeps the report.
    """
    from tilecast.loop.host_cost import ProbeSessions, save_host_costs
    from tilecast.loop.step_probe import MEASURED, mean_of_probes, take_step_probe

    passes = record_passes(record)
    counts = retake_disturbed(passes, guard, budget_s, wait_s)
    probes = probe_times(passes)
    report = {**counts, "reference_s": reference_of(passes), "reference_best_s": guard.best_s,
              "pass_best_s": min(probes) if probes else None,
              "passes_retaken_at_once": sum(p.info["retakes"] - p.late for p in passes if p.info is not None),
              "retaken_what": [p.what for p in passes if p.late]}
    if counts["retaken"]:
        for r in record:  # the kernel timings first: the probe sessions' fits simulate with the calibration
            if not isinstance(r, ProbeSessions) and any(p.late for p in r.passes):
                r.apply(cal)
        host = dict(host)
        for r in record:
            if isinstance(r, ProbeSessions) and any(p.late for p in r.passes):
                fits, cal = r.fit(machine, cal)
                host.update({k: v for k, v in fits.items() if k in r.by_key or k not in r.base})
    # the step probe again, in the state the steps ran in (tilecast.loop.step_probe)
    before = (cal.in_step_hot, cal.in_step_factor, cal.in_step_byte_s, cal.in_step_source, cal.in_step_hot_span_s)
    if cal.in_step_source:
        take_step_probe(machine, cal, guard)
    report["in_step_factor"] = {"calibration": before[1], "now": cal.in_step_factor,
                                "hot_calibration": before[0], "hot_now": cal.in_step_hot,
                                "byte_s_calibration": before[2], "byte_s_now": cal.in_step_byte_s,
                                "calibration_source": before[3], "now_source": cal.in_step_source}
    if before[3].startswith(MEASURED) and cal.in_step_source.startswith(MEASURED):
        mean_of_probes(cal, before[:3], before[3])
    report["in_step_factor"].update(hot_used=cal.in_step_hot, used=cal.in_step_factor, byte_s_used=cal.in_step_byte_s)
    cal.quiet = {"passes": counts["passes"], "passes_disturbed": counts["still_disturbed"],
                 "passes_retaken": report["passes_retaken_at_once"] + counts["retaken"],
                 "passes_retaken_late": counts["retaken"], "reference_best_s": guard.best_s,
                 "waited_s": guard.waited_s, "reference_s": report["reference_s"],
                 "judged_by": "the fastest reference of the accuracy run",
                 "lane_figures_again": (cal.quiet or {}).get("lane_figures_again", 0)}
    now = (cal.in_step_hot, cal.in_step_factor, cal.in_step_byte_s, cal.in_step_source, cal.in_step_hot_span_s)
    if counts["retaken"] or now != before:
        cal.save()
    if counts["retaken"]:
        save_host_costs(machine, host)
    return cal, host, report
