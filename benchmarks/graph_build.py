"""Build the gpt2-xl training step (batch 8, sequence 1024, every tile 256) and time it.

Prints task count, build time, tasks per second and peak resident memory per
task (growth of the process's peak RSS over its size before the build), for the
build alone and for the build followed by dependency inference. Targets:
>= 400,000 tasks/s and <= 300 bytes of peak memory per task.
Run: python3 benchmarks/graph_build.py [--model gpt2-xl --batch 8 --seq 1024 --tile 256]
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import time

import numpy as np

from tilecast.graph import Tiling
from tilecast.graph.gpt2 import build_gpt2_step
from tilecast.graph.model_config import load_model
from tilecast.perfmodel.local import conditions_line, run_conditions

TARGET_TASKS_PER_S = 400_000
TARGET_BYTES_PER_TASK = 300


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def graph_bytes(g) -> int:
    arrays = [g.kernel, g.tag, g.param_ptr, g.params, g.acc_ptr, g.acc_tile, g.acc_mode, g.tile_tensor,
              g.tile_nbytes]
    return sum(a.nbytes for a in arrays)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2-xl")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--tile", default="256")
    args = ap.parse_args()
    conditions = run_conditions()
    print(conditions_line(conditions))
    cfg, tiling = load_model(args.model), Tiling.parse(args.tile)

    build_gpt2_step(load_model("gpt2-tiny"), 1, 4, Tiling())  # warm imports and registry
    gc.collect()
    base = rss_bytes()
    t0 = time.perf_counter()
    g = build_gpt2_step(cfg, args.batch, args.seq, tiling)
    build_s = time.perf_counter() - t0
    peak_build = peak_rss_bytes() - base
    t0 = time.perf_counter()
    ptr, pred = g.dependencies
    deps_s = time.perf_counter() - t0
    peak_deps = peak_rss_bytes() - base
    n = g.n_tasks
    held = graph_bytes(g) + ptr.nbytes + pred.nbytes

    rows = [
        ("tasks", f"{n}"),
        ("dependencies", f"{len(pred)}"),
        ("build time", f"{build_s:.3f} s"),
        ("build rate", f"{n / build_s:,.0f} tasks/s (target >= {TARGET_TASKS_PER_S:,})"),
        ("peak memory / task, build", f"{peak_build / n:.0f} B (target <= {TARGET_BYTES_PER_TASK})"),
        ("dependency inference", f"{deps_s:.3f} s ({n / deps_s:,.0f} tasks/s)"),
        ("peak memory / task, build + deps", f"{peak_deps / n:.0f} B"),
        ("graph arrays held / task", f"{held / n:.0f} B"),
    ]
    print(f"{cfg.name}, batch {args.batch} x {args.seq}, tiling {tiling}")
    for k, v in rows:
        print(f"  {k:<34}{v}")
    print(json.dumps({
        "model": cfg.name, "batch": args.batch, "seq": args.seq, "tiling": tiling.describe(),
        "tasks": n, "dependencies": int(len(pred)), "build_s": build_s, "tasks_per_s": n / build_s,
        "peak_bytes_per_task": peak_build / n, "deps_s": deps_s, "peak_bytes_per_task_with_deps": peak_deps / n,
        "held_bytes_per_task": held / n,
        "targets_met": bool(n / build_s >= TARGET_TASKS_PER_S and peak_build / n <= TARGET_BYTES_PER_TASK),
        "conditions": conditions,
    }))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
