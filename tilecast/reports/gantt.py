"""Gantt chart: per worker, the predicted schedule directly above the measured one.

Drawn on matplotlib's Agg canvas directly (no pyplot), so it neither needs a
display nor changes the backend of a notebook that imports it.
"""

from __future__ import annotations

import matplotlib.colors as mcolors
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
import pandas as pd

from tilecast.reports.makespan import makespan


def kernel_colors(*traces: pd.DataFrame) -> dict:
    """A colour per kernel, shared by every plot of a report: the kernels that take the
    most time in ``traces`` together get the ten distinct Tableau colours, the rest
    colours from matplotlib's named colours."""
    time = pd.concat([t["end_s"] - t["start_s"] for t in traces]).groupby(
        pd.concat([t["kernel"] for t in traces])).sum()
    names = sorted(time.index, key=lambda k: (-time[k], k))
    palette = list(mcolors.TABLEAU_COLORS.values()) + list(mcolors.CSS4_COLORS.values())[10::7]
    return {k: palette[i % len(palette)] for i, k in enumerate(names)}


def _lanes(df: pd.DataFrame) -> list:
    """Rows of the chart: ("worker", w) for task rows, then ("link", l) for transfers."""
    lanes = [("worker", int(w)) for w in sorted(df.loc[df["task"] >= 0, "worker"].unique())]
    lanes += [("link", int(w)) for w in sorted(df.loc[df["task"] < 0, "worker"].unique())]
    return lanes


def _draw(ax, df: pd.DataFrame, y_of: dict, colors: dict) -> None:
    kind = df["task"].ge(0).map({True: "worker", False: "link"})
    for (k, w, kernel), g in df.groupby([kind, df["worker"], df["kernel"]], sort=True):
        y = y_of[(k, int(w))]
        spans = list(zip(g["start_s"].to_numpy(), (g["end_s"] - g["start_s"]).to_numpy()))
        ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=colors[kernel], linewidth=0)


def gantt_figure(pred: pd.DataFrame, real: pd.DataFrame) -> Figure:
    """One chart, one pair of rows per worker (then per link): the predicted schedule
    directly above the measured one, on a shared time axis, with each makespan marked."""
    lanes = sorted(set(_lanes(pred)) | set(_lanes(real)), key=lambda x: (x[0] != "worker", x[1]))
    colors = kernel_colors(pred, real)
    pitch = 2.6  # rows per lane pair, including the gap between workers
    fig = Figure(figsize=(12, max(3.0, 1.0 + 0.8 * len(lanes), 0.6 + 0.19 * len(colors))), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for i, (trace, offset) in enumerate(((pred, 0.0), (real, 1.0))):
        _draw(ax, trace, {lane: j * pitch + offset for j, lane in enumerate(lanes)}, colors)
        span = makespan(trace)
        ax.axvline(span, color="black", linestyle=("--", "-")[i], linewidth=0.8)
    for j in range(len(lanes)):
        if j % 2:
            ax.axhspan(j * pitch - 0.55, j * pitch + 1.55, color="0.95", zorder=0)
    ticks = [j * pitch + o for j in range(len(lanes)) for o in (0.0, 1.0)]
    labels = [f"{k} {w} {which}" for k, w in lanes for which in ("predicted", "measured")]
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_ylim((len(lanes) - 1) * pitch + 1.6, -0.6)
    ax.set_xlabel("seconds from the start of the step")
    ax.set_title(f"makespan: predicted {makespan(pred) * 1e3:.3f} ms (dashed), "
                 f"measured {makespan(real) * 1e3:.3f} ms (solid)", loc="left", fontsize=10)
    fig.legend(handles=[Patch(color=colors[k], label=k) for k in colors], loc="outside right upper",
               fontsize=8, frameon=False)  # busiest kernels first
    return fig


def schedule_figure(trace: pd.DataFrame, title: str | None = None) -> Figure:
    """One schedule alone (a predicted or a measured trace): a row per worker, then per link, each task a bar
    in its kernel's colour, the makespan marked; for a prediction before anything has run."""
    lanes = _lanes(trace)
    colors = kernel_colors(trace)
    fig = Figure(figsize=(12, max(2.5, 0.9 + 0.45 * len(lanes), 0.6 + 0.19 * len(colors))), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    _draw(ax, trace, {lane: j for j, lane in enumerate(lanes)}, colors)
    ax.axvline(makespan(trace), color="black", linewidth=0.8)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"{k} {w}" for k, w in lanes], fontsize=8)
    ax.set_ylim(len(lanes) - 0.4, -0.6)
    ax.set_xlabel("seconds from the start of the step")
    ax.set_title(title or f"makespan {makespan(trace) * 1e3:.3f} ms", loc="left", fontsize=10)
    fig.legend(handles=[Patch(color=colors[k], label=k) for k in colors], loc="outside right upper",
               fontsize=8, frameon=False)  # busiest kernels first
    return fig


def write_gantt(pred: pd.DataFrame, real: pd.DataFrame, path: str, dpi: int = 110) -> str:
    fig = gantt_figure(pred, real)
    fig.savefig(path, dpi=dpi)
    return path
