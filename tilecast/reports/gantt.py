"""Gantt chart: the predicted and the measured schedule, one above the other, per worker.

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


def _draw(ax, df: pd.DataFrame, lanes: list, colors: dict, title: str) -> None:
    y_of = {lane: i for i, lane in enumerate(lanes)}
    kind = df["task"].ge(0).map({True: "worker", False: "link"})
    for (k, w, kernel), g in df.groupby([kind, df["worker"], df["kernel"]], sort=True):
        y = y_of[(k, int(w))]
        spans = list(zip(g["start_s"].to_numpy(), (g["end_s"] - g["start_s"]).to_numpy()))
        ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=colors[kernel], linewidth=0)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"{k} {w}" for k, w in lanes])
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_title(f"{title}: makespan {makespan(df) * 1e3:.3f} ms", loc="left", fontsize=10)


def gantt_figure(pred: pd.DataFrame, real: pd.DataFrame) -> Figure:
    """Two aligned panels (predicted above, measured below) sharing the time axis."""
    lanes = sorted(set(_lanes(pred)) | set(_lanes(real)), key=lambda x: (x[0] != "worker", x[1]))
    colors = kernel_colors(pred, real)
    height = max(3.0, 1.2 + 0.35 * len(lanes)) * 2
    fig = Figure(figsize=(12, height), layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True)
    _draw(top, pred, lanes, colors, "predicted")
    _draw(bottom, real, lanes, colors, "measured")
    bottom.set_xlabel("seconds from the start of the step")
    used = list(colors)  # busiest first
    fig.legend(handles=[Patch(color=colors[k], label=k) for k in used], loc="outside right upper",
               fontsize=8, frameon=False)
    return fig


def write_gantt(pred: pd.DataFrame, real: pd.DataFrame, path: str, dpi: int = 110) -> str:
    fig = gantt_figure(pred, real)
    fig.savefig(path, dpi=dpi)
    return path
