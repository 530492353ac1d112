"""How a step's tasks run against their lanes: one factor on the lanes' cache part, fitted on a traced probe step.

Calibration times every shape as StarPU tasks three ways (hot, near: within
the shared last-level cache, cold: from main memory; :mod:`tilecast.loop.kernel_calibration`),
and a task's duration is interpolated between them by where its bytes come
back from (:mod:`tilecast.perfmodel.reuse`). In a step the tasks did not
run as those figures said: on the 2-core Xeon guest's slow state 9-18%
longer (accuracy runs 28-34, docs/accuracy.md), on a 2-core AMD EPYC (Zen 3)
guest the probe's tasks from 18% shorter to 16% longer within two hours
(runs 37-38 and tune's regret after them). The lanes cannot tell which
state a step will meet: they are timed in small graphs built to hit one
level each.

So calibration also runs a probe step, a model shape used nowhere else (not
the quiet check's reference, not a suite configuration, not an executor
probe), on one worker under ``eager``, traces it, and fits one number: by how
much its tasks scale the part of their lane figures that the cache level adds
(the interpolated figure minus the hot one), ``(traced - hot) / (lanes -
hot)`` summed over its tasks (``in_step_factor``; its shapes are calibrated
with the others, so the probe is compared with its own lanes). A forecast
scales the near and cold figures' excess over hot by it
(:class:`tilecast.perfmodel.kernel_model.DurationModel`). The whole figure
was scaled before: on both machines that moved the GEMM-bound steps of
512-wide models the wrong way (+14-24% on the Xeon, run 35; -9 to -24% on the
EPYC, run 37), whose tasks ran as their lanes said; their hot and cold figures
are close, so the cache part leaves them nearly as timed (docs/predicting.md,
"The in-step factor"). It is taken again after an accuracy run's measurement,
in the state the steps ran in (:func:`tilecast.loop.quiet_calibration.retake_calibration`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

#: the probe step's model shape: 2 layers, 160 wide, 5 heads, vocabulary 1600, batch 8 x 80, tile 80 (a tile
#: the executor's probes do not use): 849 tasks, about 50 ms a step on one worker of the 2-core Xeon
PROBE_MODEL = {"name": "gpt2-step-probe", "n_layer": 2, "n_embd": 160, "n_head": 5, "vocab_size": 1600,
               "n_positions": 128}
PROBE_BATCH, PROBE_SEQ, PROBE_TILE, PROBE_SCHED = 8, 80, "80", "eager"
PROBE_STEPS, PROBE_WARMUP = 4, 1  # the last three steps are traced (tilecast.loop.measure)
PROBE_SESSIONS = 3  # StarPU sessions of the probe; their median ratio counts (one varied by 1-3% on the Xeon)
#: the factor's range: 0 is every task at its hot figure; a probe outside it says more about the probe than the kernels
FACTOR_RANGE = (0.0, 4.0)
#: the least share of the probe's lane figures that their cache part must be for the factor to be fitted: a ratio
#: over a smaller difference is the lanes' noise (run 38: a retaken calibration whose probe lanes were 5.5% over
#: their hot figures gave 0, every task at its hot figure, and first use 13.1% at the median against 7.8% at 1)
MIN_CACHE_PART = 0.10


def probe_config():
    """The probe step's configuration (one worker, ``eager``)."""
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import from_dict
    from tilecast.loop.config import StepConfig

    return StepConfig(from_dict(PROBE_MODEL, name=PROBE_MODEL["name"]), PROBE_BATCH, PROBE_SEQ,
                      Tiling.parse(PROBE_TILE), PROBE_SCHED, 1)


def fit_in_step_factor(graph, traced: np.ndarray, machine, cal) -> tuple[float | None, dict]:
    """(factor, sums): over the probe's tasks that have lane figures and were traced (``traced``: per-task
    seconds, NaN where not traced), ``(traced - hot) / (lanes - hot)`` of the sums, with ``lanes`` the
    tasks' one-worker durations from ``cal``'s lanes without a factor; None where no task of the probe has
    lane figures or they add less than :data:`MIN_CACHE_PART` of them to the hot ones."""
    from tilecast.perfmodel.kernel_model import DurationModel
    from tilecast.perfmodel.task_lanes import lanes_of

    d = DurationModel(machine.with_workers(1), dataclasses.replace(cal, in_step_factor=1.0)).durations(graph)
    lanes = lanes_of(d)
    if lanes is None:
        return None, {"why": "no shape of the probe has lane times in the calibration"}
    # the tasks the factor scales: those with two lane figures (DurationModel's rule; one figure: learned)
    ok = np.isfinite(traced) & (lanes.delta[0] != 0.0)
    if not ok.any():
        return None, {"why": "no traced task of the probe has lane times in the calibration"}
    lane_sum, hot_sum, traced_sum = float(d[0][ok].sum()), float(lanes.hot[0][ok].sum()), float(traced[ok].sum())
    ratio = (traced_sum - hot_sum) / (lane_sum - hot_sum) if lane_sum > hot_sum else float("nan")
    sums = {"tasks": int(ok.sum()), "of": int(graph.n_tasks), "traced_s": traced_sum, "lanes_s": lane_sum,
            "hot_s": hot_sum, "ratio": ratio, "whole_ratio": traced_sum / lane_sum}
    if not lane_sum - hot_sum >= MIN_CACHE_PART * lane_sum:
        # the whole ratio is still reported: how the step's tasks ran against their lanes, whatever their cache part
        return None, {**sums, "why": f"the probe's lane figures' cache part is {100 * (1 - hot_sum / lane_sum):+.1f}% "
                                     f"of them (at least {100 * MIN_CACHE_PART:.0f}% needed): too little to scale"}
    return float(np.clip(ratio, *FACTOR_RANGE)), sums


def measure_in_step_factor(machine, cal, guard=None, sessions: int = PROBE_SESSIONS) -> tuple[float | None, str, dict]:
    """Run the probe step on StarPU in ``sessions`` sessions (each under ``guard``'s quiet check if given), fit
    the factor of each against ``cal`` (whose points learned from runs are left out) and take the median.
    Returns (factor or None, where it comes from, the median session's sums with every session's ratio)."""
    from tilecast.loop.measure import measure_round
    from tilecast.perfmodel.from_trace import task_seconds

    config, base = probe_config(), cal.calibrated_only()

    def run():
        return measure_round(config, PROBE_STEPS, PROBE_WARMUP)

    fits = []  # (factor or None, sums) of each session
    for _ in range(max(int(sessions), 1)):
        _, _, res = run() if guard is None else guard.measure(run)[0]
        per_task = np.nanmedian(np.array([task_seconds(res.graph, t) for t in res.traces]), axis=0)
        factor, sums = fit_in_step_factor(res.graph, per_task, machine, base)
        if "whole_ratio" not in sums:  # nothing of the probe to set against its lanes
            return None, f"not measured: {sums['why']}", sums
        fits.append((factor, sums))
    unfitted = [s for f, s in fits if f is None]
    if unfitted:  # the cache part too small: still say how the sessions' tasks ran against their lanes
        wholes = sorted(s["whole_ratio"] for _, s in fits)
        sums = {**unfitted[0], "whole_ratios": wholes}
        return None, (f"not measured: {sums['why']}; tasks {wholes[len(wholes) // 2]:.3f}x their lane figures "
                      f"(the median of {len(wholes)} sessions)"), sums
    factor, sums = sorted(fits, key=lambda f: f[1]["ratio"])[len(fits) // 2]
    ratio = sums["ratio"]
    sums = {**sums, "ratios": [s["ratio"] for _, s in fits]}
    source = (f"measured: {PROBE_MODEL['name']} {PROBE_BATCH}x{PROBE_SEQ} tile {PROBE_TILE} {PROBE_SCHED} on one "
              f"worker, the median of {len(fits)} sessions' traced steps: the cache part {ratio:.3f}x the lanes' "
              f"(tasks {sums['whole_ratio']:.3f}x their lane figures)")
    if factor != ratio:
        source += f" (kept within {FACTOR_RANGE[0]}-{FACTOR_RANGE[1]})"
    return factor, source, sums


def probe_graph():
    """The probe step's task graph (its shapes are calibrated with every calibration that times in StarPU)."""
    return probe_config().build()


def take_step_probe(machine, cal, guard=None) -> dict:
    """Measure the factor and set it in ``cal`` (``in_step_factor``, ``in_step_source``); a probe that cannot run
    or cannot be fitted leaves the factor at 1 and says why. Returns the sums of the fit (or the reason)."""
    try:
        factor, source, sums = measure_in_step_factor(machine, cal, guard)
    except Exception as e:  # the calibration stands without it: say why, forecast from the lanes as timed
        factor, source, sums = None, f"not measured: the probe step failed ({type(e).__name__}: {e})", {}
    cal.in_step_factor = factor if factor is not None else 1.0
    cal.in_step_source = source
    return sums
