"""The same measurement compared with two predictions: before and after recalibrating the models."""

from __future__ import annotations

import pandas as pd


def before_after_kernels(before, after) -> pd.DataFrame:
    """Per kernel, the median and 90th-percentile errors of two comparisons with the same measured trace.

    ``before`` and ``after`` are :class:`~tilecast.reports.comparison.Comparison`
    objects. Rows follow ``after``'s ranking (largest remaining difference first).
    """
    cols = ["median_error", "p90_abs_error", "total_error"]
    b = before.by_kernel.set_index("kernel")[cols].add_suffix("_before")
    a = after.by_kernel.set_index("kernel")[cols].add_suffix("_after")
    out = a.join(b, how="outer").reindex(list(after.by_kernel["kernel"]) +
                                         sorted(set(b.index) - set(after.by_kernel["kernel"])))
    order = [f"{c}_{w}" for c in cols for w in ("before", "after")]
    return out[order].rename_axis("kernel").reset_index()


def before_after_summary(before, after) -> dict:
    """Step-time (None when unknown), makespan and task-duration errors before and after (JSON-ready)."""
    from tilecast.reports.kernel_errors import overall_error

    return {
        "step_error_before": before.step_error,
        "step_error_after": after.step_error,
        "makespan_error_before": before.makespan_error,
        "makespan_error_after": after.makespan_error,
        "pred_makespan_before_s": before.pred_makespan_s,
        "pred_makespan_after_s": after.pred_makespan_s,
        "task_duration_error_before": overall_error(before.pairs),
        "task_duration_error_after": overall_error(after.pairs),
    }
