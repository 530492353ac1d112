"""Busy and idle time per worker, predicted and measured."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tilecast.reports.makespan import makespan


def busy_time(start: np.ndarray, end: np.ndarray) -> float:
    """Length of the union of the intervals [start, end) (overlaps counted once)."""
    if len(start) == 0:
        return 0.0
    order = np.argsort(start, kind="stable")
    s, e = np.asarray(start, float)[order], np.asarray(end, float)[order]
    reach = np.maximum.accumulate(e)  # furthest end seen so far
    prev = np.concatenate(([-np.inf], reach[:-1]))
    return float(np.maximum(0.0, e - np.maximum(s, prev)).sum())


def _usage(df: pd.DataFrame) -> pd.DataFrame:
    tasks = df[df["task"] >= 0]
    span = makespan(df)
    rows = [{"worker": int(w), "busy_s": busy_time(g["start_s"].to_numpy(), g["end_s"].to_numpy()),
             "tasks": int(len(g))} for w, g in tasks.groupby("worker", sort=True)]
    out = pd.DataFrame(rows, columns=["worker", "busy_s", "tasks"])
    out["idle_s"] = span - out["busy_s"]
    return out.set_index("worker")


def worker_usage(pred: pd.DataFrame, real: pd.DataFrame) -> pd.DataFrame:
    """One row per worker seen in either trace (task rows only; transfers are on links).

    Idle time is the trace's makespan minus the worker's busy time, so a worker
    with no task in one trace is idle for that whole makespan.
    """
    p, r = _usage(pred), _usage(real)
    workers = sorted(set(p.index) | set(r.index))
    out = pd.DataFrame({"worker": workers})
    for name, u, df in (("pred", p, pred), ("real", r, real)):
        u = u.reindex(workers)
        out[f"{name}_tasks"] = u["tasks"].fillna(0).astype("int64").to_numpy()
        out[f"{name}_busy_s"] = u["busy_s"].fillna(0.0).to_numpy()
        out[f"{name}_idle_s"] = u["idle_s"].fillna(makespan(df)).to_numpy()
    return out


def makespan_breakdown(by_worker: pd.DataFrame) -> dict:
    """Split the makespan difference into task time and idle time.

    For each trace, W x makespan = sum of busy + sum of idle over its W workers
    (idle is defined as makespan - busy), so over the W workers of
    :func:`worker_usage`, pred - real makespan = (busy difference + idle
    difference) / W exactly: the first term is what mispredicted task durations
    explain, the second what waiting (dependencies, scheduling) explains.
    """
    w = len(by_worker)
    busy = float(by_worker["pred_busy_s"].sum() - by_worker["real_busy_s"].sum())
    idle = float(by_worker["pred_idle_s"].sum() - by_worker["real_idle_s"].sum())
    return {"workers": w, "from_task_time_s": busy / w if w else 0.0, "from_idle_time_s": idle / w if w else 0.0}
