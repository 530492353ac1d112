"""How close hot/cold lane times interpolated by reuse distance come to the task durations measured in steps.

Reads per-task tables (Parquet) of three configurations measured on the
2-core Xeon (2 MiB L2 per core): each task's duration inside traced steps
on 1 and 2 workers (``real1``, ``real2``) beside the same shape's lane
times, hot (``hot1``, ``hot2``; ``prio1``, ``prio2`` in the first table) and
cold (``grp1``, ``grp2``), rows in the order of
``np.concatenate([k.tasks for k in graph_shapes(graph)])``. It prints each
step's sum of predicted durations against the measured sum, two ways, both
through tilecast's own code:

- per task: the table's hot and cold figures through
  :func:`tilecast.perfmodel.reuse.cold_fraction` and
  :func:`~tilecast.perfmodel.reuse.interpolate`;
- per shape: a :class:`~tilecast.perfmodel.calibration.Calibration` holding
  each shape's median hot and cold figures (as ``tilecast calibrate``
  stores them), through :meth:`DurationModel.durations`.

Usage: ``python3 benchmarks/reuse_interpolation.py [--data DIR] [--cache BYTES]``
(default cache: this machine's L2 per core; the tables were measured with 2 MiB).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import pandas as pd

from tilecast.graph import Tiling
from tilecast.graph.gpt2 import build_gpt2_step
from tilecast.graph.model_config import load_model
from tilecast.kernels import all_kernels
from tilecast.perfmodel import parse_machine
from tilecast.perfmodel.cache_size import l2_per_core
from tilecast.perfmodel.calibration import STARPU_TASKS, Calibration
from tilecast.perfmodel.kernel_model import DurationModel
from tilecast.perfmodel.reuse import cold_fraction, interpolate
from tilecast.perfmodel.shapes import graph_shapes

M4 = json.dumps({"name": "gpt2-4x128", "n_layer": 4, "n_embd": 128, "n_head": 4, "vocab_size": 2048,
                 "n_positions": 256})
# name: (model, batch, seq, tiling, table, its columns renamed to hot1/hot2)
CONFIGS = {
    "gpt2-4x128 8x64 tile embd=32,inner=32,vocab=32": (M4, 8, 64, "embd=32,inner=32,vocab=32", "tasks2",
                                                       {"prio1": "hot1", "prio2": "hot2"}),
    "gpt2-4x128 8x64 tile 128": (M4, 8, 64, "128", "t128", {}),
    "gpt2-tiny 32x128 tile 64": ("gpt2-tiny", 32, 128, "64", "tiny64", {}),
}


def _machine(cache_bytes: float):
    fig = lambda v: {"value": v, "source": "benchmarks/reuse_interpolation.py"}  # noqa: E731
    kind = {"peak_tflops": fig(1.0), "memory_bandwidth_GBps": fig(10.0), "compute_efficiency": fig(1.0),
            "memory_efficiency": fig(1.0), "half_efficiency_gflop": fig(0.0), "launch_us": fig(0.0),
            "l2_per_core_KiB": fig(cache_bytes / 1024)}
    return parse_machine({"format": 1, "name": "reuse-check", "runtime": {"task_overhead_us": fig(0.0)},
                          "memory_nodes": [{"name": "host", "kind": "ram", "capacity_GiB": fig(64)}],
                          "worker_kinds": {"cpu": kind},
                          "workers": [{"name": "cpu", "kind": "cpu", "count": 1, "memory_node": "host"}]},
                         where="reuse-check")


def per_shape_calibration(machine, graph, hot: np.ndarray, cold: np.ndarray) -> Calibration:
    """Each shape's median hot and cold figure over its tasks (rows in graph_shapes order)."""
    cal = Calibration(machine.name, machine.fingerprint(), "cpu", STARPU_TASKS)
    at = 0
    for ks in graph_shapes(graph):
        name = all_kernels()[ks.kernel].name
        rows = slice(at, at + len(ks.tasks))
        at += len(ks.tasks)
        for j, shape in enumerate(ks.shapes):
            mine = ks.inverse == j
            cal.add(name, shape, float(np.median(cold[rows][mine])), 0.0, STARPU_TASKS)
            cal.add_hot(name, shape, float(np.median(hot[rows][mine])))
    return cal


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "data", "lane_times"),
                   help="directory of the per-task tables (default: benchmarks/data/lane_times)")
    p.add_argument("--cache", type=float, default=None, help="cache bytes (default: this machine's L2 per core)")
    args = p.parse_args()
    cache, source = (args.cache, "--cache") if args.cache else l2_per_core()
    print(f"cache {cache / 2**20:.3f} MiB ({source}); sums over a step's tasks, ms; error of the prediction "
          "against the measured in-step sum")
    machine = _machine(cache)
    print(f"{'configuration':<48}{'w':>2}{'in step':>9}{'hot':>14}{'cold':>14}{'per task':>16}{'per shape':>16}")
    for name, (model, batch, seq, tiling, table, renamed) in CONFIGS.items():
        g = build_gpt2_step(load_model(model), batch, seq, Tiling.parse(tiling))
        df = pd.read_parquet(os.path.join(args.data, f"{table}.parquet")).rename(columns=renamed)
        order = np.concatenate([k.tasks for k in graph_shapes(g)])  # table row -> task
        if len(order) != len(df):
            raise SystemExit(f"{table}: {len(df)} rows, but the graph has {len(order)} tasks")
        f = cold_fraction(g, cache)[order]
        for w in (1, 2):
            hot = df[f"hot{w}"].to_numpy() if f"hot{w}" in df else df["hot2"].to_numpy()
            cold = df[f"grp{w}"].to_numpy() if f"grp{w}" in df else df["grp2"].to_numpy()
            real = df[f"real{w}"].sum()
            task = interpolate(hot, cold, f).sum()
            shape = DurationModel(machine, per_shape_calibration(machine, g, hot, cold)).durations(g)[0].sum()

            def fmt(x):
                return f"{x * 1e3:7.1f} {100 * (x / real - 1):+5.1f}%"

            print(f"{name:<48}{w:>2}{real * 1e3:>9.1f}{fmt(hot.sum()):>14}{fmt(cold.sum()):>14}"
                  f"{fmt(task):>16}{fmt(shape):>16}")


if __name__ == "__main__":
    main()
