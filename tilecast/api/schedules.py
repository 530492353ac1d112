"""``tc.gantt`` and ``tc.kernel_times``: where a predicted or measured step's time goes, from a result."""

from __future__ import annotations

from tilecast.errors import FieldError


def _trace(name: str, x):
    """The trace DataFrame of a :func:`simulate` / :func:`run` result, or ``x`` itself if it is one."""
    import pandas as pd

    from tilecast.api import RunResult, SimulateResult

    if isinstance(x, SimulateResult):
        return x.trace()
    if isinstance(x, RunResult):
        if x.trace is None:
            raise FieldError(f"{name}: this run result holds no trace")
        return x.trace
    if isinstance(x, pd.DataFrame):
        return x
    raise FieldError(f"{name} must be a tc.simulate or tc.run result or a trace DataFrame, got {type(x).__name__}")


def gantt(result, real=None, title: str | None = None):
    """A matplotlib Figure of a step's schedule: one row per worker, each task a bar in its kernel's colour.

    ``result``: a :func:`simulate` or :func:`run` result (or a trace DataFrame); with ``real`` (a run result
    or trace) the predicted and measured schedules are drawn one above the other on one time axis."""
    from tilecast.reports.gantt import gantt_figure, schedule_figure

    pred = _trace("result", result)
    if real is None:
        return schedule_figure(pred, title)
    return gantt_figure(pred, _trace("real", real))


def kernel_times(result):
    """Per kernel, busiest first: ``tasks``, ``busy_s`` (task time summed over workers, s), ``gflop``,
    ``share`` (of the busy time, 0-1), ``gflops`` (GFLOP/s while busy) and ``color`` (the kernel's colour in
    :func:`gantt`), from a result's trace."""
    from tilecast.reports.gantt import kernel_colors

    trace = _trace("result", result)
    tasks = trace[trace["task"] >= 0].assign(busy_s=lambda t: t["end_s"] - t["start_s"])
    per = (tasks.groupby("kernel").agg(tasks=("task", "size"), busy_s=("busy_s", "sum"), gflop=("flops", "sum"))
           .sort_values("busy_s", ascending=False))
    per["gflop"] /= 1e9
    per["share"] = per["busy_s"] / per["busy_s"].sum()
    per["gflops"] = per["gflop"] / per["busy_s"]
    per["color"] = per.index.map(kernel_colors(trace))
    return per
