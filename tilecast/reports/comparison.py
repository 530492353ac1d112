"""Comparing a predicted trace with a measured one of the same graph.

>>> c = compare("pred.parquet", "real.parquet")      # or two DataFrames
>>> c.step_error                                     # (pred - real) / real of the step time, if the traces hold it
>>> c.makespan_error                                 # the same for the makespan, the step's part in the traces
>>> c.by_kernel                                      # per-kernel duration errors
>>> c.write("report/")                               # PNGs, Chrome JSON, summary JSON, HTML

Every relative error here is (predicted - measured) / measured: positive when
the prediction is too slow, negative when it is too fast.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tilecast import trace as tr
from tilecast.reports.attribution import attribute
from tilecast.reports.disk_traffic import disk_summary
from tilecast.reports.before_after import before_after_kernels, before_after_summary
from tilecast.reports.kernel_errors import kernel_errors, overall_error
from tilecast.reports.makespan import makespan, relative_error
from tilecast.reports.pairing import ComparisonError, check_trace, pair_tasks
from tilecast.reports.step_time import step_parts, step_summary
from tilecast.reports.worker_usage import makespan_breakdown, worker_usage

TOP = 10  # rows of each ranking kept in the summary


@dataclass
class Comparison:
    """The figures of one prediction against one measurement (see :func:`compare`).

    - ``pairs``: one row per task in both traces (durations, difference, error);
    - ``by_kernel``: per kernel, summed times, median and 90th-percentile errors,
      ranked by |pred - real| summed time;
    - ``by_worker``: busy and idle seconds per worker, predicted and measured;
    - ``by_tag`` / ``by_phase``: the tags / phases (tags with layer numbers
      merged) ranked by their share of the total absolute difference;
    - ``pred_makespan_s``, ``real_makespan_s``, :attr:`makespan_error`;
    - ``pred_step``, ``real_step``: ``(step s, its makespan s)`` when known
      (:mod:`tilecast.reports.step_time`), and :attr:`step_error`.
    """

    pred: pd.DataFrame
    real: pd.DataFrame
    pairs: pd.DataFrame
    by_kernel: pd.DataFrame
    by_worker: pd.DataFrame
    by_tag: pd.DataFrame
    by_phase: pd.DataFrame
    pred_makespan_s: float
    real_makespan_s: float
    unmatched: dict = field(default_factory=dict)
    graph: object = None  # optional: gives the Chrome traces dependency arrows
    before: "Comparison | None" = None  # optional: the same measurement against an earlier prediction
    pred_step: tuple | None = None
    real_step: tuple | None = None

    @property
    def makespan_error(self) -> float:
        return relative_error(self.pred_makespan_s, self.real_makespan_s)

    @property
    def step_error(self) -> float | None:
        """(predicted - measured) / measured step time; None unless both are known."""
        return step_summary(self.pred_step, self.real_step)["error"]

    def transfers(self) -> dict:
        out = {}
        for name, df in (("pred", self.pred), ("real", self.real)):
            t = df[df["task"] < 0]
            out[f"{name}_count"] = int(len(t))
            out[f"{name}_s"] = float((t["end_s"] - t["start_s"]).sum())
            out[f"{name}_bytes"] = int(t["bytes"].sum())
        return out

    def summary(self, top: int = TOP) -> dict:
        """Every figure of the comparison as plain JSON-ready values (NaN -> None)."""
        s = {
            "step": step_summary(self.pred_step, self.real_step),
            "makespan": {
                "pred_s": self.pred_makespan_s,
                "real_s": self.real_makespan_s,
                "diff_s": self.pred_makespan_s - self.real_makespan_s,
                "error": self.makespan_error,
                **makespan_breakdown(self.by_worker),
            },
            "tasks": {"matched": int(len(self.pairs)), **self.unmatched},
            "task_duration_error": overall_error(self.pairs),
            "work": {
                "pred_s": float(self.pairs["pred_s"].sum()),
                "real_s": float(self.pairs["real_s"].sum()),
                "diff_s": float(self.pairs["diff_s"].sum()),
            },
            "by_kernel": _records(self.by_kernel),
            "by_worker": _records(self.by_worker),
            "top_kernels": _records(attribute(self.pairs, "kernel").head(top)),
            "top_tags": _records(self.by_tag.head(top)),
            "top_phases": _records(self.by_phase.head(top)),
            "transfers": self.transfers(),
        }
        disk = disk_summary(self.pred, self.real)
        if disk is not None:
            s["disk"] = disk
        if self.before is not None:
            s["before_after"] = {**before_after_summary(self.before, self),
                                 "by_kernel": _records(before_after_kernels(self.before, self))}
        return _clean(s)

    def write(self, folder: str, chrome: bool = True) -> dict:
        """Write the report files into ``folder``; return {what: path}.

        Files: ``report.html`` (self-contained), ``gantt.png``, ``kernel_errors.png``,
        ``summary.json``, ``by_kernel.csv`` and, unless ``chrome`` is False (they
        are large for big graphs: about 200 bytes a task), ``pred.trace.json`` and
        ``real.trace.json`` (Chrome trace format, for Perfetto).
        """
        from tilecast.reports.error_plot import write_error_plot
        from tilecast.reports.gantt import kernel_colors, write_gantt
        from tilecast.reports.html_page import write_html

        os.makedirs(folder, exist_ok=True)
        p = lambda name: os.path.join(folder, name)  # noqa: E731
        paths = {
            "gantt_png": write_gantt(self.pred, self.real, p("gantt.png")),
            "errors_png": write_error_plot(self.by_kernel, kernel_colors(self.pred, self.real),
                                           p("kernel_errors.png")),
            "by_kernel_csv": p("by_kernel.csv"),
            "summary_json": p("summary.json"),
        }
        if chrome:
            paths["pred_chrome_json"] = tr.save(self.pred, p("pred.trace.json"), graph=self.graph)
            paths["real_chrome_json"] = tr.save(self.real, p("real.trace.json"), graph=self.graph)
        self.by_kernel.to_csv(paths["by_kernel_csv"], index=False)
        with open(paths["summary_json"], "w") as f:
            json.dump(self.summary(), f, indent=1)
        paths["html"] = write_html(self, paths, p("report.html"))
        return paths

    def _repr_html_(self) -> str:  # notebooks
        from tilecast.reports.html_page import tables_html
        return tables_html(self)


def _read(x, name: str, source: str | None) -> pd.DataFrame:
    if isinstance(x, (str, os.PathLike)):
        try:
            x = tr.load(os.fspath(x))
        except tr.TraceError as e:
            raise ComparisonError(f"{name}: {e}") from None
        except Exception as e:  # unreadable Parquet/CSV: pyarrow, pandas and decoding errors
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ComparisonError(f"{name}: cannot read {os.fspath(x)}: {first}") from None
    if not isinstance(x, pd.DataFrame):
        raise ComparisonError(f"{name}: expected a trace DataFrame or file path, got {type(x).__name__}")
    return check_trace(x, name, source)


def compare(pred, real, *, check_sources: bool = True, graph=None, before=None, pred_step=None, real_step=None,
            before_step=None) -> Comparison:
    """Compare predicted trace ``pred`` with measured trace ``real`` (DataFrames or .parquet/.csv paths).

    ``graph``, if given (the traces' task graph), only adds dependency arrows to
    the Chrome traces that :meth:`Comparison.write` produces. ``before``, if
    given, is an earlier prediction of the same run (e.g. before recalibrating
    the kernel models): the summary and the page then show both errors.

    ``pred_step``, ``real_step``, ``before_step``: the step times, in seconds
    (the step whose tasks the trace holds) or as ``(step s, makespan s)`` (a
    median over several steps and their median makespan); by default the
    step time a trace records (:func:`tilecast.trace.step_time`), if any. The
    step time comes first in the summary and on the page, the makespan as its
    part.

    With ``check_sources`` (default) ``pred`` must hold only source 'sim' rows
    and ``real`` only 'real' rows; turn it off to compare, say, two measured
    runs. Raises :class:`ComparisonError` (one-line message) for traces that
    are unreadable, empty, of different graphs, or hold a task twice.
    """
    return _compare(pred, real, check_sources, graph, before, "PRED", pred_step, real_step, before_step)


def _compare(pred, real, check_sources, graph, before, pred_name, pred_step=None, real_step=None,
             before_step=None) -> Comparison:
    pred = _read(pred, pred_name, "sim" if check_sources else None)
    real = _read(real, "REAL", "real" if check_sources else None)
    pairs = pair_tasks(pred, real)
    if real_step is None:
        real_step = tr.step_time(real)
    earlier = None if before is None else _compare(before, real, check_sources, graph, None, "before",
                                                   before_step, real_step)
    pt, rt = set(pred.loc[pred["task"] >= 0, "task"]), set(real.loc[real["task"] >= 0, "task"])
    return Comparison(
        pred=pred, real=real, pairs=pairs,
        by_kernel=kernel_errors(pairs),
        by_worker=worker_usage(pred, real),
        by_tag=attribute(pairs, "tag"),
        by_phase=attribute(pairs, "phase"),
        pred_makespan_s=makespan(pred),
        real_makespan_s=makespan(real),
        unmatched={"pred_only": len(pt - rt), "real_only": len(rt - pt)},
        graph=graph,
        before=earlier,
        pred_step=step_parts(tr.step_time(pred) if pred_step is None else pred_step, makespan(pred)),
        real_step=step_parts(real_step, makespan(real)),
    )


def _records(df: pd.DataFrame) -> list:
    return [{k: (v.item() if isinstance(v, np.generic) else v) for k, v in row.items()}
            for row in df.to_dict(orient="records")]


def _clean(x):
    """Replace NaN/inf by None so the summary is strict JSON."""
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x
