"""The task runtime's cost per task, read from a real trace.

On a worker, a task cannot start before the worker's previous task has ended
and before its own inputs are written (its last predecessor's end). What
passes between the later of those two instants and its start is what the
runtime spends on it: releasing it from its predecessor, the scheduler's
push and pop, the profiling and the callbacks. The simulator charges that as
a fixed cost before each task (``Machine.task_overhead``); this measures it
per StarPU scheduler, on this machine, from the traces of real steps.
"""

from __future__ import annotations

import numpy as np

TRIM = 0.02  # the largest delays dropped: a worker preempted by another process is not the runtime's cost


def start_delays(graph, trace) -> np.ndarray:
    """Seconds each traced task (but every worker's first) waited beyond its worker being free and its
    inputs being ready."""
    tasks = trace[trace["task"] >= 0].sort_values("start_s", kind="stable")
    n = graph.n_tasks
    if tasks.empty:
        return np.zeros(0)
    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    ids = tasks["task"].to_numpy()
    start[ids] = tasks["start_s"].to_numpy()
    end[ids] = tasks["end_s"].to_numpy()
    pred_ptr, pred = graph.dependencies
    has_pred = np.diff(pred_ptr) > 0
    ready = np.zeros(n)
    if len(pred):
        ready[has_pred] = np.maximum.reduceat(end[pred], pred_ptr[:-1][has_pred])
    out = []
    for _, rows in tasks.groupby("worker", sort=False):
        t = rows["task"].to_numpy()  # a worker's first task is left out: when it became free is not traced
        out.append(start[t[1:]] - np.maximum(end[t[:-1]], ready[t[1:]]))
    d = np.concatenate(out)
    return np.maximum(d[np.isfinite(d)], 0.0)


def task_overhead(graph, trace, trim: float = TRIM) -> float:
    """The mean start delay of a real trace's tasks (the largest ``trim`` share left out), in seconds."""
    d = np.sort(start_delays(graph, trace))
    if not len(d):
        raise ValueError("the trace has no task rows to measure the runtime's cost per task on")
    keep = max(1, int(len(d) * (1.0 - trim)))
    return float(d[:keep].mean())
