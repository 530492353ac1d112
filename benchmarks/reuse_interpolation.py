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

and, for 1 and 2 workers, with the cold share computed per worker
(:mod:`tilecast.simulator.worker_cache`: a tile is hot when the task's
worker touched it last, within its cache) instead of in graph order, over
two kinds of schedule:

- traced: the order and workers of real dmda steps of the same
  configurations (``schedules.npz``: per step, its tasks in start order and
  each one's worker), each replayed through a
  :class:`~tilecast.simulator.worker_cache.WorkerCache`;
- simulated: the per-shape calibration's durations simulated under dmda on
  that many workers (``simulate``), with the per-worker share and without it
  (``Engine.worker_cache``), the sums of the simulated task durations.

Then the same by kernel on 2 workers. The last line is a JSON object with
every figure (``*_err``: relative error of a predicted sum against the
measured one).

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
from tilecast.perfmodel.local import run_conditions
from tilecast.perfmodel.shapes import graph_shapes
from tilecast.simulator.engine import Engine
from tilecast.simulator.simulate import simulate
from tilecast.simulator.worker_cache import WorkerCache

M4 = json.dumps({"name": "gpt2-4x128", "n_layer": 4, "n_embd": 128, "n_head": 4, "vocab_size": 2048,
                 "n_positions": 256})
# name: (model, batch, seq, tiling, table, its columns renamed to hot1/hot2)
CONFIGS = {
    "gpt2-4x128 8x64 tile embd=32,inner=32,vocab=32": (M4, 8, 64, "embd=32,inner=32,vocab=32", "tasks2",
                                                       {"prio1": "hot1", "prio2": "hot2"}),
    "gpt2-4x128 8x64 tile 128": (M4, 8, 64, "128", "t128", {}),
    "gpt2-tiny 32x128 tile 64": ("gpt2-tiny", 32, 128, "64", "tiny64", {}),
}


def _machine(cache_bytes: float, workers: int = 1):
    fig = lambda v: {"value": v, "source": "benchmarks/reuse_interpolation.py"}  # noqa: E731
    kind = {"peak_tflops": fig(1.0), "memory_bandwidth_GBps": fig(10.0), "compute_efficiency": fig(1.0),
            "memory_efficiency": fig(1.0), "half_efficiency_gflop": fig(0.0), "launch_us": fig(0.0),
            "l2_per_core_KiB": fig(cache_bytes / 1024)}
    return parse_machine({"format": 1, "name": "reuse-check", "runtime": {"task_overhead_us": fig(0.0)},
                          "memory_nodes": [{"name": "host", "kind": "ram", "capacity_GiB": fig(64)}],
                          "worker_kinds": {"cpu": kind},
                          "workers": [{"name": "cpu", "kind": "cpu", "count": workers, "memory_node": "host"}]},
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


def traced_shares(graph, lanes_shape, schedules: dict, key: str, cache: float, workers: int) -> list:
    """Per traced step of ``key`` (``<table>_w<workers>``), each task's cold share replayed per worker."""
    from tilecast.perfmodel.task_lanes import TaskLanes

    zero = np.zeros(lanes_shape)
    out = []
    for name in sorted(k[:-5] for k in schedules if k.startswith(key + "_") and k.endswith("_task")):
        wc = WorkerCache(TaskLanes(zero, zero, (cache,), zero), graph, [0] * max(workers, 1))
        f = np.zeros(graph.n_tasks)
        for t, w in zip(schedules[name + "_task"].tolist(), schedules[name + "_worker"].tolist()):
            f[t] = wc.cold_share(t, w)
        out.append(f)
    return out


def simulated_durations(graph, cal, cache: float, workers: int, per_worker: bool) -> np.ndarray:
    """Each task's simulated duration (dmda on ``workers``, no runtime cost), per-worker shares or graph order's."""
    m = _machine(cache, workers)
    d = DurationModel(m, cal).durations(graph)
    Engine.worker_cache = per_worker
    try:
        r = simulate(graph, m, "dmda", durations=d)
    finally:
        Engine.worker_cache = True
    return r.end - r.start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "data", "lane_times"),
                   help="directory of the per-task tables (default: benchmarks/data/lane_times)")
    p.add_argument("--schedules", default=os.path.join(os.path.dirname(__file__), "data", "lane_times",
                                                        "schedules.npz"),
                   help="traced steps' task order and workers (default: benchmarks/data/lane_times/schedules.npz)")
    p.add_argument("--cache", type=float, default=None, help="cache bytes (default: this machine's L2 per core)")
    args = p.parse_args()
    cache, source = (args.cache, "--cache") if args.cache else l2_per_core()
    print(f"cache {cache / 2**20:.3f} MiB ({source}); sums over a step's tasks, ms; error of the prediction "
          "against the measured in-step sum")
    machine = _machine(cache)
    schedules = dict(np.load(args.schedules)) if os.path.exists(args.schedules) else {}
    print(f"{'configuration':<48}{'w':>2}{'in step':>9}{'hot':>14}{'cold':>14}{'per task':>16}{'per shape':>16}"
          f"{'traced, per worker':>20}{'sim, graph order':>18}{'sim, per worker':>18}")
    figures, kernels = [], []
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
            cal = per_shape_calibration(machine, g, hot, cold)
            shape = DurationModel(machine, cal).durations(g)[0].sum()
            traced = [interpolate(hot, cold, fw[order]) for fw in traced_shares(g, (1, g.n_tasks), schedules,
                                                                                 f"{table}_w{w}", cache, w)]
            sim_graph = simulated_durations(g, cal, cache, w, False)
            sim_worker = simulated_durations(g, cal, cache, w, True)
            traced_sum = float(np.mean([t.sum() for t in traced])) if traced else float("nan")

            def fmt(x):
                return f"{x * 1e3:7.1f} {100 * (x / real - 1):+5.1f}%"

            print(f"{name:<48}{w:>2}{real * 1e3:>9.1f}{fmt(hot.sum()):>14}{fmt(cold.sum()):>14}"
                  f"{fmt(task):>16}{fmt(shape):>16}{fmt(traced_sum):>20}{fmt(sim_graph.sum()):>18}"
                  f"{fmt(sim_worker.sum()):>18}")
            err = lambda x: float(x / real - 1)  # noqa: E731
            figures.append({"configuration": name, "workers": w, "in_step_s": float(real),
                            "hot_err": err(hot.sum()), "cold_err": err(cold.sum()),
                            "graph_order_per_task_err": err(task), "graph_order_per_shape_err": err(shape),
                            "traced_per_worker_err": err(traced_sum), "traced_schedules": len(traced),
                            "sim_graph_order_err": err(sim_graph.sum()), "sim_per_worker_err": err(sim_worker.sum())})
            if w == 2:
                by = pd.DataFrame({"kernel": df.kernel.to_numpy(), "real": df["real2"].to_numpy(),
                                   "graph": interpolate(hot, cold, f),
                                   "traced": np.mean(traced, axis=0) if traced else np.nan,
                                   "sim_graph": sim_graph[order], "sim_worker": sim_worker[order]})
                by = by.groupby("kernel").sum()
                by["configuration"] = name
                kernels.append(by.reset_index())
    by = pd.concat(kernels).groupby("kernel").sum(numeric_only=True).sort_values("real", ascending=False)
    print("\nby kernel, 2 workers, the three configurations together (ms; error of each prediction)")
    print(f"{'kernel':<18}{'in step':>9}{'graph order':>13}{'traced, per worker':>20}{'sim, graph':>12}"
          f"{'sim, per worker':>17}")
    rows = []
    for k, r in by.iterrows():
        e = {c: float(r[c] / r["real"] - 1) for c in ("graph", "traced", "sim_graph", "sim_worker")}
        print(f"{k:<18}{r['real'] * 1e3:>9.2f}{100 * e['graph']:>+12.1f}%{100 * e['traced']:>+19.1f}%"
              f"{100 * e['sim_graph']:>+11.1f}%{100 * e['sim_worker']:>+16.1f}%")
        rows.append({"kernel": k, "in_step_s": float(r["real"]), **{c + "_err": v for c, v in e.items()}})
    print(json.dumps({"cache_bytes": cache, "conditions": run_conditions(), "steps": figures, "kernels_2_workers": rows}))

if __name__ == "__main__":
    main()
