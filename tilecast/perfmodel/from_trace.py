"""Kernel models learned from measured execution traces (StarPU runs).

A real trace gives one duration per executed task; grouped by task shape
(:mod:`tilecast.perfmodel.shapes`) they become calibration points (median and
median absolute deviation per shape), so a run on the real runtime refines the
models used by the next simulation.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tilecast.kernels import all_kernels
from tilecast.perfmodel.calibration import Calibration
from tilecast.perfmodel.shapes import graph_shapes


def calibration_from_trace(graph, trace: pd.DataFrame, machine, kind: str | None = None,
                           base: Calibration | None = None) -> Calibration:
    """Calibration points from the task rows of a ``source='real'`` trace of ``graph``.

    Points measured here replace those of ``base`` (if given) for the same
    kernel and shape; other points of ``base`` are kept.
    """
    tasks = trace[(trace["task"] >= 0) & (trace["source"] == "real")]
    if tasks.empty:
        raise ValueError("the trace has no measured task rows (source='real', task >= 0)")
    if tasks["task"].max() >= graph.n_tasks:
        raise ValueError(f"the trace names task {int(tasks['task'].max())}, the graph has {graph.n_tasks}")
    seconds = np.full(graph.n_tasks, np.nan)
    seconds[tasks["task"].to_numpy()] = (tasks["end_s"] - tasks["start_s"]).to_numpy()
    cal = Calibration(machine.name, machine.fingerprint(), kind or machine.kind_names[0], "trace")
    learned = set()
    for ks in graph_shapes(graph):
        name = all_kernels()[ks.kernel].name
        t = seconds[ks.tasks]
        ok = np.isfinite(t) & (t > 0)
        if not ok.any():
            continue
        df = pd.DataFrame({"shape": ks.inverse[ok], "t": t[ok]})
        med = df.groupby("shape")["t"].median()
        mad = df.assign(dev=(df["t"] - df["shape"].map(med)).abs()).groupby("shape")["dev"].median()
        for row, m, d in zip(med.index.to_numpy(), med.to_numpy(), mad.to_numpy()):
            cal.add(name, ks.shapes[row], m, d)
            learned.add((name, tuple(ks.shapes[row].tolist())))
    if base is not None:
        for name, e in base.points.items():
            for shape, m, d in zip(e["shapes"], e["median_s"], e["mad_s"]):
                if (name, tuple(shape)) not in learned:
                    cal.add(name, shape, m, d)
    return cal
