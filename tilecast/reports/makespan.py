"""Makespan of a trace and the relative error of a prediction."""

from __future__ import annotations

import math

import pandas as pd


def makespan(df: pd.DataFrame) -> float:
    """Step time covered by a trace: last end minus the step start.

    Trace times are seconds from the start of the step, so the step starts at 0
    (or at the earliest start, if a row starts before 0).
    """
    if df.empty:
        return 0.0
    return float(df["end_s"].max() - min(0.0, float(df["start_s"].min())))


def relative_error(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured; positive when the prediction is too slow."""
    if measured == 0:
        return 0.0 if predicted == 0 else math.inf
    return (predicted - measured) / measured
