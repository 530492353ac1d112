"""Where one measured step's time goes: kernels at their rate against a GEMM peak, idle workers, the host.

For a step of wall time ``step_s`` run on ``W`` workers with a trace of makespan ``M``:

    W x step_s = sum of kernel busy time + idle time inside the makespan + W x (step_s - M)

so the three parts, divided by ``W x step_s``, add up to 1. Each kernel's
achieved rate (its flops over its busy time, per worker) is set against the
GEMM rate one worker reaches with the same BLAS (``peak_per_worker``), which
is how far below the peak each kernel pulls the step.
"""

from __future__ import annotations

import pandas as pd

from tilecast.reports.makespan import makespan
from tilecast.reports.worker_usage import busy_time


def kernel_rates(trace: pd.DataFrame, peak_per_worker: float) -> pd.DataFrame:
    """One row per kernel, largest busy time first: tasks, busy seconds, GFLOP, GFLOP/s, share of peak."""
    tasks = trace[trace["task"] >= 0]
    dur = tasks["end_s"] - tasks["start_s"]
    g = tasks.assign(busy_s=dur).groupby("kernel", sort=False)
    out = pd.DataFrame({"tasks": g.size(), "busy_s": g["busy_s"].sum(), "gflop": g["flops"].sum() / 1e9})
    out["gflops"] = out["gflop"] / out["busy_s"].where(out["busy_s"] > 0)
    out["of_peak"] = out["gflops"] * 1e9 / peak_per_worker
    return out.sort_values("busy_s", ascending=False)


def time_budget(trace: pd.DataFrame, step_s: float, workers: int) -> dict:
    """Shares of ``workers x step_s`` in kernels, idle inside the makespan, and outside it (host)."""
    tasks = trace[trace["task"] >= 0]
    span = makespan(trace)
    busy = sum(busy_time(w["start_s"].to_numpy(), w["end_s"].to_numpy()) for _, w in tasks.groupby("worker"))
    total = workers * step_s
    return {"step_s": step_s, "makespan_s": span, "host_s": step_s - span, "busy_share": busy / total,
            "idle_share": (workers * span - busy) / total, "host_share": workers * (step_s - span) / total}
