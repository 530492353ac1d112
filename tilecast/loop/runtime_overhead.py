"""The task runtime's cost per task, read from a real trace.

On a worker, a task cannot start before the worker's previous task has ended
and before its own inputs are written (its last predecessor's end). What
passes between the later of those two instants and its start is what the
runtime spends on it: releasing it from its predecessor, the scheduler's
push and pop, the profiling and the callbacks. The simulator charges that as
a fixed cost before each task (``Machine.task_overhead``); this measures it
per StarPU scheduler, on this machine, from the traces of real steps.

That cost is not the same for every task (:func:`fit_gap_model`): a StarPU
CPU worker, between the profiled end of one task and the profiled start of
its next, writes back the ended task's buffers (``_starpu_push_task_output``),
runs its termination (``_starpu_handle_job_termination``, src/core/jobs.c:
releases each buffer's implicit dependencies, notifies every successor,
pushes those made ready to the scheduler, runs the callback), pops its next
task and acquires each of that task's buffers (``_starpu_fetch_task_input``),
all in the worker's own thread (``_starpu_cpu_driver_run_once``,
src/drivers/cpu/driver_cpu.c). So the delay follows a constant, the buffers
of the task about to start, and the buffers and successors of the task the
worker just ended, and the successors it made ready (pushed to the scheduler).

On several workers one more thing counts: whether the task starts on the
worker that made it ready. A task made ready on one core and popped on
another (a *handoff*) is reached through structures the other core wrote
last: its job, pushed by ``_starpu_handle_job_termination`` on the releasing
worker, is popped by ``_starpu_get_worker_task``
(src/drivers/driver_common/driver_common.c) and its buffers' handles, whose
headers the releasing worker updated, are acquired by
``_starpu_fetch_task_input`` (src/datawizard/coherency.c) on the new one,
each a cache line to fetch from the other core. On one worker there is no
handoff; on two, the traced steps of the 4-layer GPT-2 at tile 32 under
eager handed over 9-44% of their tasks.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import nnls

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


#: the columns of :func:`gap_terms`' design matrix, the order of a gap model's coefficients
GAP_TERMS = ("constant", "start_buffer", "end_buffer", "successor", "ready", "handoff")


def gap_terms(graph, trace) -> tuple[np.ndarray, np.ndarray]:
    """(start delays s, design matrix) of a real trace's tasks but every worker's first: the matrix's columns are
    :data:`GAP_TERMS` (1, the starting task's buffers, the worker's previous task's buffers, that task's
    successors, and those of them it made ready: whose last predecessor to end it was; and 1 where the starting
    task's last predecessor to end ran on another worker: a handoff)."""
    d, x, _ = gap_rows(graph, trace)
    return d, x


def gap_rows(graph, trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`gap_terms` and, per row, the task its worker ran before (the task whose end the delay follows)."""
    tasks = trace[trace["task"] >= 0].sort_values("start_s", kind="stable")
    n = graph.n_tasks
    pred_ptr, pred = graph.dependencies
    nbuf = np.diff(np.asarray(graph.acc_ptr)).astype(np.float64)
    nsucc = np.bincount(np.asarray(pred, dtype=np.int64), minlength=n).astype(np.float64)
    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    worker = np.full(n, -1, dtype=np.int64)
    ids = tasks["task"].to_numpy()
    start[ids] = tasks["start_s"].to_numpy()
    end[ids] = tasks["end_s"].to_numpy()
    worker[ids] = tasks["worker"].to_numpy()
    has_pred = np.diff(pred_ptr) > 0
    ready = np.zeros(n)
    if len(pred):
        ready[has_pred] = np.maximum.reduceat(end[pred], pred_ptr[:-1][has_pred])
    prev, nxt = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)]
    for _, rows in tasks.groupby("worker", sort=False):
        t = rows["task"].to_numpy()
        prev.append(t[:-1])
        nxt.append(t[1:])
    prev, nxt = np.concatenate(prev), np.concatenate(nxt)
    of = np.repeat(np.arange(n), np.diff(pred_ptr))  # the successor of each predecessor entry
    last = end[pred] == ready[of]  # the entries of each task's last predecessor to end
    made_ready = np.bincount(np.asarray(pred, dtype=np.int64)[last], minlength=n)
    made_on = np.full(n, -1, dtype=np.int64)  # the worker of each task's last predecessor to end
    made_on[of[last]] = worker[np.asarray(pred, dtype=np.int64)[last]]
    handoff = ((made_on >= 0) & (made_on != worker)).astype(np.float64)
    d = start[nxt] - np.maximum(end[prev], ready[nxt])
    ok = np.isfinite(d)
    d, prev, nxt = np.maximum(d[ok], 0.0), prev[ok], nxt[ok]
    return d, np.stack([np.ones(len(d)), nbuf[nxt], nbuf[prev], nsucc[prev], made_ready[prev], handoff[nxt]],
                       axis=1), prev


PREEMPTED_S = 100e-6  # a delay this far above the model's: the worker was preempted (a time slice is milliseconds)


def mean_excess(samples, coef, preempted_s: float | None = PREEMPTED_S) -> float:
    """Seconds by which the mean start delay of a trace of ``samples`` = [(graph, trace)] exceeds the mean that
    the costs ``coef`` (:data:`GAP_TERMS` order) give its tasks, the median over the traces. Every delay
    counts but those more than ``preempted_s`` above the model's (a worker preempted by another process: the
    load of the moment, not the runtime's cost; None: every delay)."""
    per = []
    for g, t in samples:
        d, x = gap_terms(g, t)
        r = d - x @ np.asarray(coef, dtype=np.float64)
        if preempted_s is not None:
            r = r[r <= preempted_s]
        if len(r):
            per.append(float(r.mean()))
    return float(np.median(per)) if per else 0.0


def fit_gap_model(samples, trim: float = TRIM, terms=GAP_TERMS, mean: bool = True) -> np.ndarray:
    """Non-negative least-squares seconds per :data:`GAP_TERMS` of the start delays of ``samples`` = [(graph,
    trace)] pooled: what the runtime spends between a worker's tasks. Fitted twice: the second time without
    the ``trim`` share of delays farthest above the first fit (a worker preempted by another process), so that
    the long delays the model explains (a task releasing many successors) are kept. ``terms``: the terms
    fitted (the others are 0; ``benchmarks/gap_decomposition.py`` fits the model without the handoff).

    ``mean`` (the default): the constant is then moved by :func:`mean_excess` (where that would take it below
    0, it is 0 and the other costs shrink instead: :func:`_slopes_to_mean`), so that the model gives the traces'
    mean delay, the trimmed ones included but for a preempted worker's. A makespan adds every delay up, as it
    adds every task's duration, which are learned as means (:mod:`tilecast.perfmodel.from_trace`); the
    trimmed fit alone gives the typical delay: on the traced steps of 2026-12-01 it gave 3-13% less
    than the mean of their delays shorter than 100 us (docs/accuracy.md). False: the fit as it was before."""
    parts = [gap_terms(g, t) for g, t in samples]
    d = np.concatenate([p[0] for p in parts])
    if not len(d):
        raise ValueError("the traces have no task rows to measure the runtime's cost between tasks on")
    x = np.concatenate([p[1] for p in parts])
    x[:, [k not in terms for k in GAP_TERMS]] = 0.0
    scale = x.max(axis=0)
    scale[scale == 0] = 1.0
    c, _ = nnls(x / scale, d)
    if trim > 0:
        keep = np.argsort(d - (x / scale) @ c, kind="stable")[:max(1, int(len(d) * (1.0 - trim)))]
        c, _ = nnls(x[keep] / scale, d[keep])
    c = c / scale
    if mean:
        c[0] += mean_excess(samples, c)
        if c[0] < 0.0:
            c = _slopes_to_mean(samples, c)
    return c


def _slopes_to_mean(samples, c: np.ndarray) -> np.ndarray:
    """``c`` with its constant at 0 and its other costs scaled down so that the model gives the traces' mean
    delay (:func:`mean_excess` 0), where the constant alone would have had to go below 0 for that: the pooled
    fit's costs per buffer and successor were set by longer delays than the median trace's (probes of different
    shapes on two workers)."""
    from scipy.optimize import brentq

    slopes = np.concatenate([[0.0], c[1:]])
    if mean_excess(samples, np.zeros_like(slopes)) <= 0.0:  # the traces wait less than nothing: no cost
        return np.zeros_like(slopes)
    if mean_excess(samples, slopes) >= 0.0:  # the whole slopes already within the mean (a preempted delay let in)
        return slopes
    return slopes * brentq(lambda k: mean_excess(samples, slopes * k), 0.0, 1.0, xtol=1e-9)


def delay_excess(graph, traces, simulated) -> float:
    """Seconds per task by which the measured ``traces`` of ``graph`` (real, one step each) wait between tasks
    more than the ``simulated`` trace of the same graph does: the median over the traces of their mean
    start delay (:func:`start_delays`, none trimmed), less the simulated mean. What a run teaches the cost
    between tasks beyond the probes' model of it: with durations learned from the same traces, a
    simulation that waits that much more between tasks adds up to the traced steps."""
    real = [start_delays(graph, t[t["task"] >= 0]) for t in traces]
    real = [float(d.mean()) for d in real if len(d)]
    sim = start_delays(graph, simulated[simulated["task"] >= 0])
    if not real or not len(sim):
        return 0.0
    return float(np.median(real)) - float(sim.mean())
