"""Per-kernel duration error of a prediction."""

from __future__ import annotations

import numpy as np
import pandas as pd

KERNEL_COLUMNS = ["kernel", "tasks", "pred_s", "real_s", "diff_s", "total_error", "median_error",
                  "p90_abs_error"]


def kernel_errors(pairs: pd.DataFrame) -> pd.DataFrame:
    """One row per kernel, from :func:`~tilecast.reports.pairing.pair_tasks` output.

    ``pred_s``/``real_s``: summed durations; ``diff_s`` = pred_s - real_s;
    ``total_error`` = diff_s / real_s; ``median_error``: median of the tasks'
    signed relative errors; ``p90_abs_error``: 90th percentile of their absolute
    values (linear interpolation, numpy's default). Sorted by |diff_s|, largest first.
    """
    rows = []
    for kernel, g in pairs.groupby("kernel", sort=True):
        err = g["error"].to_numpy()
        err = err[np.isfinite(err)]
        real = float(g["real_s"].sum())
        pred = float(g["pred_s"].sum())
        rows.append({
            "kernel": kernel,
            "tasks": int(len(g)),
            "pred_s": pred,
            "real_s": real,
            "diff_s": pred - real,
            "total_error": (pred - real) / real if real > 0 else np.nan,
            "median_error": float(np.median(err)) if err.size else np.nan,
            "p90_abs_error": float(np.percentile(np.abs(err), 90)) if err.size else np.nan,
        })
    out = pd.DataFrame(rows, columns=KERNEL_COLUMNS)
    order = np.argsort(-out["diff_s"].abs().to_numpy(), kind="stable")
    return out.iloc[order].reset_index(drop=True)


def overall_error(pairs: pd.DataFrame) -> dict:
    """Median signed and 90th-percentile absolute relative error over all paired tasks."""
    err = pairs["error"].to_numpy()
    err = err[np.isfinite(err)]
    if not err.size:
        return {"median_error": None, "p90_abs_error": None}
    return {"median_error": float(np.median(err)), "p90_abs_error": float(np.percentile(np.abs(err), 90))}
