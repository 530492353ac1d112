"""Pairing a predicted trace with a measured one, task by task.

Rows are matched by graph task id (transfers, task -1, are not paired). Two
traces belong to the same graph only if every task id they share names the same
kernel; a task id that appears twice in one trace (e.g. a trace holding several
steps) is refused, since the pairing would be ambiguous.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tilecast import trace as tr


class ComparisonError(ValueError):
    """Two traces that cannot be compared; the message is one line naming why."""


def check_trace(df: pd.DataFrame, name: str, source: str | None) -> pd.DataFrame:
    """Validate ``df`` against the trace schema and, if given, its expected ``source``."""
    try:
        df = tr.validate(df)
    except tr.TraceError as e:
        raise ComparisonError(f"{name}: {e}") from None
    tasks = df[df["task"] >= 0]
    if tasks.empty:
        raise ComparisonError(f"{name}: the trace has no task rows")
    if source is not None:
        found = sorted(set(df["source"]))
        if found != [source]:
            hint = " (are PRED and REAL swapped?)" if source in ("sim", "real") else ""
            raise ComparisonError(f"{name}: expected source {source!r}, found {found}{hint}")
    dup = tasks["task"].duplicated()
    if dup.any():
        t = int(tasks["task"][dup].iloc[0])
        raise ComparisonError(f"{name}: task {t} appears more than once; give a trace of one step")
    return df


def pair_tasks(pred: pd.DataFrame, real: pd.DataFrame) -> pd.DataFrame:
    """One row per task present in both traces.

    Columns: ``task``, ``kernel``, ``tag`` (from the measured trace), ``pred_s``
    and ``real_s`` (durations), ``diff_s`` = pred_s - real_s, and ``error`` =
    (pred_s - real_s) / real_s, the signed relative error of the prediction
    (positive: predicted slower than measured; NaN where real_s is 0).
    """
    cols = ["task", "kernel", "tag", "start_s", "end_s"]
    p = pred.loc[pred["task"] >= 0, cols]
    r = real.loc[real["task"] >= 0, cols]
    m = p.merge(r, on="task", suffixes=("_pred", "_real"), how="inner", validate="one_to_one")
    if m.empty:
        raise ComparisonError("PRED and REAL share no task id; they are not traces of the same graph")
    differ = m["kernel_pred"] != m["kernel_real"]
    if differ.any():
        row = m[differ].iloc[0]
        raise ComparisonError(
            f"task {int(row.task)} is {row.kernel_pred!r} in PRED but {row.kernel_real!r} in REAL; "
            "the traces are not of the same graph")
    pred_s = (m["end_s_pred"] - m["start_s_pred"]).to_numpy()
    real_s = (m["end_s_real"] - m["start_s_real"]).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        error = np.where(real_s > 0, (pred_s - real_s) / np.where(real_s > 0, real_s, 1.0), np.nan)
    out = pd.DataFrame({
        "task": m["task"].to_numpy(),
        "kernel": m["kernel_pred"].to_numpy(),
        "tag": m["tag_real"].to_numpy(),
        "pred_s": pred_s,
        "real_s": real_s,
        "diff_s": pred_s - real_s,
        "error": error,
    })
    return out.sort_values("task", kind="stable").reset_index(drop=True)
