"""Kernel models learned from measured execution traces (StarPU runs).

A real trace gives one duration per executed task; grouped by task shape
(:mod:`tilecast.perfmodel.shapes`) they become calibration points, so a run on
the real runtime refines the models used by the next simulation. A point's
seconds are the shape's mean in the trace, not its median as for a shape timed
alone: a makespan adds tasks up, and the few that the submitting thread (a
third thread on the workers' cores) interrupted count in it too.

Given four or more traces of the same graph (steps from different sessions),
a point is the mean of the shape's per-step means over the central steps
(:func:`central_steps`: the steps whose traced work lies within the
interquartile range of the steps'): a step that ran in a slow spell, or whose
task was preempted for a whole time slice, has more work and is left out;
within a central step every task counts as it ran. Not the median over the
steps of the shape's mean, nor durations capped at a multiple of the shape's
median: for a shape of a few tasks per step the mean is skewed (the
occasional interrupted task), its median falls below its mean, and a step,
the sum of every shape's tasks, follows the means. On the measured traces of
the tiny model's two-worker steps (loaded machine), the capped medians added
up to 56-79% less work than the median step's, the central means to -6% ..
+4% (``benchmarks/simgrid_gap.py``, docs/benchmarks.md). With fewer traces
(a probe's step) a duration counts at most ``OUTLIER_FACTOR`` times the
shape's median in that trace, so that one task preempted for a whole time
slice does not set the point, and a point is the median over the traces of
those means. The spread kept is the median absolute
deviation of all the durations. Where the base calibration had timed the
same shapes alone, both times become runtime samples, from which the
kernel's runtime excess is fitted for its shapes only timed alone
(:class:`~tilecast.perfmodel.calibration.Calibration`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tilecast.kernels import all_kernels
from tilecast.perfmodel.calibration import IN_RUNTIME, LEARNED, TRACE, Calibration
from tilecast.perfmodel.shapes import graph_shapes, shape_bytes

OUTLIER_FACTOR = 4.0  # with few traces, a task's duration counts at most this many times its shape's median in the step
CENTRAL_MIN_STEPS = 4  # with fewer traced steps, a point is the median over the steps of the shape's mean


def task_seconds(graph, trace: pd.DataFrame) -> np.ndarray:
    """Per task of ``graph``, its measured duration in a ``source='real'`` trace (NaN where absent)."""
    tasks = trace[(trace["task"] >= 0) & (trace["source"] == "real")]
    if tasks.empty:
        raise ValueError("the trace has no measured task rows (source='real', task >= 0)")
    if tasks["task"].max() >= graph.n_tasks:
        raise ValueError(f"the trace names task {int(tasks['task'].max())}, the graph has {graph.n_tasks}")
    seconds = np.full(graph.n_tasks, np.nan)
    seconds[tasks["task"].to_numpy()] = (tasks["end_s"] - tasks["start_s"]).to_numpy()
    return seconds


def central_steps(per_step: list) -> np.ndarray | None:
    """Indices of the steps whose traced work (the sum of their task durations) lies within the interquartile
    range of the steps': the steps around the median step, which the measured figure is. None when fewer
    than :data:`CENTRAL_MIN_STEPS` steps were traced (too few to tell a central one)."""
    work = np.array([np.nansum(np.where(s > 0, s, np.nan)) for s in per_step])
    if len(work) < CENTRAL_MIN_STEPS:
        return None
    lo, hi = np.quantile(work, [0.25, 0.75])
    return np.flatnonzero((work >= lo) & (work <= hi))


def over_steps(step_means: pd.Series, central: np.ndarray) -> pd.Series:
    """Per shape, the mean of its per-step means over the ``central`` steps (:func:`central_steps`); the median
    over every step where ``central`` is None, or for a shape traced in none of them."""
    every = step_means.groupby(level="shape").median()
    if central is None:
        return every
    steps = step_means.index.get_level_values("step")
    inside = step_means[np.isin(steps, central)].groupby(level="shape").mean()
    return inside.reindex(every.index).fillna(every)


def calibration_from_trace(graph, trace, machine, kind: str | None = None,
                           base: Calibration | None = None, source: str = TRACE, workers: int = 0,
                           central: bool = True) -> Calibration:
    """Calibration points from the task rows of a ``source='real'`` trace of ``graph`` (or a list of them).

    Points measured here replace those of ``base`` (if given) for the same
    kernel and shape that were learned the same way (from runs, :data:`LEARNED`,
    or not); other points of ``base`` are kept, so that the calibration's own
    points stay beside what runs taught (``Calibration.calibrated_only``).
    ``source``: :data:`TRACE` for runs of the user's configurations,
    ``PROBE_TRACE`` for calibration's own probe steps. ``workers``: how many
    workers ran the traced steps (0: not said); points are then kept per
    worker count (a point learned on one count replaces only a point learned
    on the same count), and predictions for that many workers take them first
    (:meth:`Calibration.arrays`): in-step durations on one worker and on two
    differ, and learning both into one median made the two-worker steps of
    short tasks too fast. ``central`` False: the rule for few traces whatever
    their number (the rule before 2026-12-01, for comparisons).
    """
    traces = list(trace) if isinstance(trace, (list, tuple)) else [trace]
    if not traces:
        raise ValueError("no trace to learn from")
    per_step = [task_seconds(graph, t) for t in traces]
    central = central_steps(per_step) if central else None
    cal = Calibration(machine.name, machine.fingerprint(), kind or machine.kind_names[0], source)
    learned_class = source in LEARNED
    learned = set()
    isolated = {}
    if base is not None:
        for name, e in base.points.items():
            for shape, m, src in zip(e["shapes"], e["median_s"], base.sources(name)):
                if src not in IN_RUNTIME:
                    isolated[(name, tuple(shape))] = m
    new_samples: dict = {}
    for ks in graph_shapes(graph):
        name = all_kernels()[ks.kernel].name
        t = np.concatenate([s[ks.tasks] for s in per_step])
        step = np.repeat(np.arange(len(per_step)), len(ks.tasks))
        ok = np.isfinite(t) & (t > 0)
        if not ok.any():
            continue
        df = pd.DataFrame({"shape": np.tile(ks.inverse, len(per_step))[ok], "step": step[ok], "t": t[ok]})
        # a task preempted for a whole time slice can last 30x its shape's median, and with one trace it
        # alone would set the shape's mean (measured: a 19 us GEMM learned at 546 us from a probe step)
        if central is None:  # few steps: one task preempted for a whole time slice must not set the point
            typical = df.groupby(["shape", "step"])["t"].transform("median")
            df_mean = df.assign(t=np.minimum(df["t"], OUTLIER_FACTOR * typical))
        else:  # the central steps leave out a step that such a task made long; in one of them it counts
            df_mean = df
        mean = over_steps(df_mean.groupby(["shape", "step"])["t"].mean(), central)
        med = df.groupby("shape")["t"].median()
        mad = df.assign(dev=(df["t"] - df["shape"].map(med)).abs()).groupby("shape")["dev"].median()
        for row, m, d in zip(mean.index.to_numpy(), mean.to_numpy(), mad.loc[mean.index].to_numpy()):
            cal.add(name, ks.shapes[row], m, d, source, workers)
            key = (name, tuple(ks.shapes[row].tolist()))
            learned.add(key + (int(workers),))
            if key in isolated:
                nbytes = float(shape_bytes(ks.kernel, ks.shapes[row:row + 1, ks.n_params:])[0])
                new_samples.setdefault(name, []).append([nbytes, isolated[key], float(m)])
    if base is not None:  # every lane time, cache size and sample of base (points learned here take no lane time)
        carried = base.without_points(source)
        carried.points, carried.machine, carried.fingerprint, carried.kind = (cal.points, cal.machine,
                                                                              cal.fingerprint, cal.kind)
        cal = carried
        for name, e in base.points.items():
            for shape, m, d, src, w in zip(e["shapes"], e["median_s"], e["mad_s"], base.sources(name),
                                           base.point_workers(name)):
                if (name, tuple(shape), w) not in learned or (src in LEARNED) != learned_class:
                    cal.add(name, shape, m, d, src, w)
    for name, rows in new_samples.items():
        cal.runtime_samples.setdefault(name, []).extend(rows)
    return cal
