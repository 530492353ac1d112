"""How a step's tasks run against their lanes: three terms, on the lanes' hot figure, on their cache part and per
byte a task accesses, fitted on a traced probe step.

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
probe), on one worker under ``eager``, traces it, and fits three numbers to
its tasks (its shapes are calibrated with the others, so the probe is
compared with its own lanes): ``traced ~ r * hot + a * (lanes - hot) + b *
bytes``, with ``lanes`` a task's interpolated figure and ``bytes`` those of
the tiles it accesses, by least squares relative to each task's time, held
to the probe's traced sum (``in_step_hot`` = r, ``in_step_factor`` = a,
``in_step_byte_s`` = b). A forecast takes ``r * hot + b * bytes + a * (near
or cold - hot)`` for every task with lane figures
(:class:`tilecast.perfmodel.kernel_model.DurationModel`), and a task longer
than the probe's longest (its hot figure, ``in_step_hot_span_s``: the fit's
range) gains from ``r`` what that one gains, not its share: the probe's
products take 0.1 ms, a 512-wide model's 2.7.

One factor was fitted before, on one part. On the whole figure it moved the
GEMM-bound steps of 512-wide models the wrong way (+14-24% on the Xeon,
run 35; -9 to -24% on the EPYC, run 37). On the cache part alone it needed a
guard (a part under 10% of the lanes was not fitted), and the Xeon guest's
probe sat at it (8-9%): the factor jumped between 1 and 2.2-2.6 from one
calibration to the next, and first use's bias with it between -15% and +4%
(runs 51-53). Fitted task by task, that guest's probe put most of its excess
on the hot figure and in proportion to the bytes (r 1.08-1.13, a 0.65-0.82,
b 14-17 ps a byte over four sessions, the tasks 1.15-1.23x their lanes):
a product of small tiles longer than one of large tiles, as measured
(docs/predicting.md, "Three terms, fitted task by task"). The terms are
taken again after an accuracy run's measurement, in the state the steps ran
in (:func:`tilecast.loop.quiet_calibration.retake_calibration`).
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
#: the terms' ranges: a cache part of 0 is every task at its hot figure; a probe outside them says more about the
#: probe than the kernels (a cost per byte of 1 ns is a pass over the task's bytes at 1 GB/s)
FACTOR_RANGE = (0.0, 4.0)
HOT_RANGE = (0.5, 2.0)
BYTE_RANGE = (0.0, 1e-9)
#: the least share of the probe's lane figures that their cache part must be for its own factor to be fitted; below,
#: it is left at 1 and the other terms take the whole excess (the columns are not told apart)
MIN_CACHE_PART = 0.02
#: how a probe's source starts when its terms were fitted (and not otherwise)
MEASURED = "measured:"


def probe_config():
    """The probe step's configuration (one worker, ``eager``)."""
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import from_dict
    from tilecast.loop.config import StepConfig

    return StepConfig(from_dict(PROBE_MODEL, name=PROBE_MODEL["name"]), PROBE_BATCH, PROBE_SEQ,
                      Tiling.parse(PROBE_TILE), PROBE_SCHED, 1)


def _held_to_sum(target: np.ndarray, cols: list, traced: np.ndarray) -> np.ndarray:
    """Coefficients ``c`` minimising ``sum((target - X c)^2 / traced)`` with ``sum(X c) == sum(target)`` (X's
    columns ``cols``), solved on columns scaled to sums of 1 (seconds and bytes differ by ten decades)."""
    x = np.stack(cols, axis=1)
    scale = x.sum(axis=0)
    scale[scale == 0] = 1.0
    xs, norm = x / scale, float(traced.sum())
    ys, w = target / norm, norm / np.maximum(traced, 1e-300)
    n = x.shape[1]
    kkt = np.zeros((n + 1, n + 1))  # the weighted normal equations with the sum as a constraint (a Lagrange multiplier)
    kkt[:n, :n], kkt[:n, n], kkt[n, :n] = xs.T @ (xs * w[:, None]), xs.sum(axis=0), xs.sum(axis=0)
    c = np.linalg.lstsq(kkt, np.append(xs.T @ (w * ys), ys.sum()), rcond=None)[0][:n]
    return c * norm / scale


def fit_factors(traced: np.ndarray, hot: np.ndarray, part: np.ndarray, nbytes: np.ndarray
                ) -> tuple[float, float, float]:
    """(r, a, b): ``traced ~ r * hot + a * part + b * nbytes`` by least squares on each task's error relative to
    its traced time, the probe's traced sum matched. ``b`` (seconds per byte) within :data:`BYTE_RANGE` and ``a``
    within :data:`FACTOR_RANGE` (1 where the cache part is under :data:`MIN_CACHE_PART` of the lanes), the others
    fitted again where ``b`` was held at a bound; then ``r`` from the sum, within :data:`HOT_RANGE`."""
    y, h, c, nb = (np.asarray(v, dtype=np.float64) for v in (traced, hot, part, nbytes))
    total, hs, cs = float(y.sum()), float(h.sum()), float(c.sum())
    fit_a = cs >= MIN_CACHE_PART * (hs + cs)
    given = np.zeros_like(y) if fit_a else c  # a cache part too small to fit stays at 1
    free = [h, c] if fit_a else [h]
    coef = _held_to_sum(y - given, free + [nb], y)
    b = float(coef[-1]) if np.isfinite(coef[-1]) else 0.0
    if not BYTE_RANGE[0] <= b <= BYTE_RANGE[1]:  # held at its bound: the others fitted again without it
        b = float(np.clip(b, *BYTE_RANGE))
        coef = _held_to_sum(y - given - b * nb, free, y)
    a = float(np.clip(coef[1], *FACTOR_RANGE)) if fit_a and np.isfinite(coef[1]) else 1.0
    r = (total - a * cs - b * float(nb.sum())) / hs if hs > 0 else 1.0
    return float(np.clip(r, *HOT_RANGE)), a, b


def fit_in_step_factors(graph, traced: np.ndarray, machine, cal) -> tuple[tuple[float, float, float] | None, dict]:
    """((hot factor, cache-part factor, seconds per byte), sums): over the probe's tasks that have lane figures
    and were traced (``traced``: per-task seconds, NaN where not traced), :func:`fit_factors` of their traced
    times against their hot figures, cache parts (``lanes - hot``, ``lanes`` the tasks' one-worker durations from
    ``cal``'s lanes without the in-step terms) and bytes; None where no task of the probe has lane figures."""
    from tilecast.perfmodel.kernel_model import DurationModel
    from tilecast.perfmodel.reuse import task_bytes
    from tilecast.perfmodel.task_lanes import lanes_of

    plain = dataclasses.replace(cal, in_step_factor=1.0, in_step_hot=1.0, in_step_byte_s=0.0)
    d = DurationModel(machine.with_workers(1), plain).durations(graph)
    lanes = lanes_of(d)
    if lanes is None:
        return None, {"why": "no shape of the probe has lane times in the calibration"}
    # the tasks the factors scale: those with two lane figures (DurationModel's rule; one figure: learned)
    ok = np.isfinite(traced) & (lanes.delta[0] != 0.0)
    if not ok.any():
        return None, {"why": "no traced task of the probe has lane times in the calibration"}
    lane, hot, y, nbytes = d[0][ok], lanes.hot[0][ok], traced[ok], task_bytes(graph)[ok]
    r, a, b = fit_factors(y, hot, lane - hot, nbytes)
    lane_sum, hot_sum, traced_sum = float(lane.sum()), float(hot.sum()), float(y.sum())
    sums = {"tasks": int(ok.sum()), "of": int(graph.n_tasks), "traced_s": traced_sum, "lanes_s": lane_sum,
            "hot_s": hot_sum, "bytes": float(nbytes.sum()), "whole_ratio": traced_sum / lane_sum, "hot_factor": r,
            "cache_factor": a, "byte_s": b, "cache_part": 1.0 - hot_sum / lane_sum, "hot_span_s": float(hot.max())}
    return (r, a, b), sums


def measure_in_step_factors(machine, cal, guard=None, sessions: int = PROBE_SESSIONS
                              ) -> tuple[tuple[float, float, float] | None, str, dict]:
    """Run the probe step on StarPU in ``sessions`` sessions (each under ``guard``'s quiet check if given), fit
    the factors of each against ``cal`` (whose points learned from runs are left out) and keep the session of
    the median whole ratio (its tasks against their lanes). Returns ((hot factor, cache-part factor, seconds a
    byte) or None, where they come from, that session's sums with every session's whole ratio)."""
    from tilecast.loop.measure import measure_round
    from tilecast.perfmodel.from_trace import task_seconds

    config, base = probe_config(), cal.calibrated_only()

    def run():
        return measure_round(config, PROBE_STEPS, PROBE_WARMUP)

    fits = []  # (factors, sums) of each session
    for _ in range(max(int(sessions), 1)):
        _, _, res = run() if guard is None else guard.measure(run)[0]
        per_task = np.nanmedian(np.array([task_seconds(res.graph, t) for t in res.traces]), axis=0)
        factors, sums = fit_in_step_factors(res.graph, per_task, machine, base)
        if factors is None:  # nothing of the probe to set against its lanes
            return None, f"not measured: {sums['why']}", sums
        fits.append((factors, sums))
    (r, a, b), sums = sorted(fits, key=lambda f: f[1]["whole_ratio"])[len(fits) // 2]
    sums = {**sums, "whole_ratios": sorted(s["whole_ratio"] for _, s in fits)}
    source = (f"{MEASURED} {PROBE_MODEL['name']} {PROBE_BATCH}x{PROBE_SEQ} tile {PROBE_TILE} {PROBE_SCHED} on one "
              f"worker, the median of {len(fits)} sessions' traced steps: tasks {sums['whole_ratio']:.3f}x their "
              f"lane figures, fitted as the hot figure x{r:.3f}, the cache part "
              f"({100 * sums['cache_part']:.1f}% of the lanes) x{a:.3f} and {b * 1e12:.1f} ps a byte")
    return (r, a, b), source, sums


def mean_of_probes(cal, earlier: tuple, earlier_source: str) -> None:
    """Set ``cal``'s in-step terms to the mean of ``earlier`` (hot factor, cache-part factor, seconds a byte, from
    the probe taken while calibrating) and its own (the probe taken again after the measurement).

    The suite's steps ran between the two probes, some twenty minutes apart, and each probe's terms move with
    the guest's state from one to the next (on the 2-core Xeon guest the hot factor x0.96-1.09, the cache part's
    x0.38-1.37 within an hour: docs/accuracy.md, runs 58-60); their mean forecast runs 58-60 with 52, 48 and 53
    of 56 rows within 10%, against 47 each from the later probe alone. The span stays the later probe's (the
    lanes it was read from are the forecast's)."""
    now = (cal.in_step_hot, cal.in_step_factor, cal.in_step_byte_s)
    cal.in_step_hot, cal.in_step_factor, cal.in_step_byte_s = ((a + b) / 2 for a, b in zip(earlier, now))
    cal.in_step_source = (f"{MEASURED} the mean of two probes, while calibrating and after the accuracy suite's "
                          f"measurement: hot figure x{cal.in_step_hot:.3f}, cache part x{cal.in_step_factor:.3f}, "
                          f"{cal.in_step_byte_s * 1e12:.1f} ps a byte (the first: "
                          f"{earlier_source[len(MEASURED):].strip()}; the second: "
                          f"{cal.in_step_source[len(MEASURED):].strip()})")


def probe_graph():
    """The probe step's task graph (its shapes are calibrated with every calibration that times in StarPU)."""
    return probe_config().build()


def take_step_probe(machine, cal, guard=None) -> dict:
    """Measure the terms and set them in ``cal`` (``in_step_hot``, ``in_step_factor``, ``in_step_byte_s``,
    ``in_step_source``); a probe that cannot run or cannot be fitted leaves them at 1, 1 and 0 and says why.
    Returns the sums of the fit (or the reason)."""
    try:
        factors, source, sums = measure_in_step_factors(machine, cal, guard)
    except Exception as e:  # the calibration stands without it: say why, forecast from the lanes as timed
        factors, source, sums = None, f"not measured: the probe step failed ({type(e).__name__}: {e})", {}
    cal.in_step_hot, cal.in_step_factor, cal.in_step_byte_s = factors if factors is not None else (1.0, 1.0, 0.0)
    cal.in_step_hot_span_s = float(sums["hot_span_s"]) if factors is not None else 0.0
    cal.in_step_source = source
    return sums


def in_step_line(cal) -> str:
    """How a calibration's in-step terms were measured (the source gives them), for people."""
    return f"tasks in a step against their lanes: {cal.in_step_source}"
