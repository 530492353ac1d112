"""A step's time and its two parts: the makespan of its tasks and the host's time outside them.

The step time is what a user waits for; the makespan is the part a trace
covers. A figure is given as seconds (its makespan is then the trace's) or as
a pair ``(step s, makespan s)`` when it is a median over several steps whose
own makespans it is compared with.
"""

from __future__ import annotations

from tilecast.reports.makespan import relative_error


def step_parts(step, trace_makespan_s: float) -> tuple | None:
    """``(step s, makespan s)`` of a step figure (None, seconds, or a pair), or None when unknown."""
    if step is None:
        return None
    if isinstance(step, (tuple, list)):
        return float(step[0]), float(step[1])
    return float(step), float(trace_makespan_s)


def step_summary(pred: tuple | None, real: tuple | None) -> dict:
    """Predicted and measured step time, makespan and host time (step less makespan), with the errors;
    None where a side's step time is unknown."""
    out = {}
    for side, parts in (("pred", pred), ("real", real)):
        out[f"{side}_s"] = None if parts is None else parts[0]
        out[f"{side}_makespan_s"] = None if parts is None else parts[1]
        out[f"{side}_host_s"] = None if parts is None else parts[0] - parts[1]
    known = pred is not None and real is not None
    out["error"] = relative_error(pred[0], real[0]) if known else None
    out["makespan_error"] = relative_error(pred[1], real[1]) if known else None
    return out
