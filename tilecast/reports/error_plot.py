"""Error-by-kernel plot: each kernel's relative duration error and its share of the difference."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure



def error_figure(by_kernel: pd.DataFrame, colors: dict) -> Figure:
    """Left: median signed error per kernel, with its 90th-percentile absolute error
    as a marker on the same side as the bar; right: summed predicted and measured time per kernel."""
    k = by_kernel.iloc[::-1]  # largest difference at the top
    y = np.arange(len(k))
    fig = Figure(figsize=(12, max(2.5, 0.9 + 0.4 * len(k))), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2, sharey=True)
    left.barh(y, k["median_error"].fillna(0.0) * 100, color=[colors[n] for n in k["kernel"]])
    side = np.where(k["median_error"].fillna(0.0) < 0, -1.0, 1.0)  # marker on the bar's side
    left.scatter(side * k["p90_abs_error"] * 100, y, marker="|", s=200, color="black", label="90th pct. |error|")
    left.axvline(0, color="grey", linewidth=0.8)
    left.set_yticks(y)
    left.set_yticklabels(k["kernel"])
    left.set_xlabel("median error of task durations, % ((pred - real) / real)")
    left.legend(loc="lower right", fontsize=8)
    right.barh(y + 0.2, k["pred_s"] * 1e3, height=0.4, color="tab:blue", label="predicted")
    right.barh(y - 0.2, k["real_s"] * 1e3, height=0.4, color="tab:orange", label="measured")
    right.set_xlabel("summed task time, ms")
    right.legend(loc="lower right", fontsize=8)
    return fig


def write_error_plot(by_kernel: pd.DataFrame, colors: dict, path: str, dpi: int = 110) -> str:
    """``colors``: kernel -> colour, as :func:`~tilecast.reports.gantt.kernel_colors` gives."""
    error_figure(by_kernel, colors).savefig(path, dpi=dpi)
    return path
