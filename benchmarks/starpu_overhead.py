"""tilecast's own per-task cost on StarPU, against StarPU alone, on the same tasks.

Both sides run the same graph's tasks as empty codelets with the same handles
and access modes (so the same dependencies), on the same session:

- StarPU alone: tasks created with starpu_task_create and submitted in a C loop,
  no profiling, no callbacks (registration not counted);
- tilecast: ``StarPUSession.execute(graph, store, dry=True)``, the whole call as
  a user sees it: tile registration, bulk submission from the graph's arrays,
  profiling info per task, completion callbacks, unregistration and the trace
  DataFrame.

Prints a table, then one JSON line. Usage: python3 benchmarks/starpu_overhead.py [--tile 8] [--sched eager]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from tilecast.executor.sample_graphs import tiled_matmul_gelu
from tilecast.executor.starpu_session import StarPUSession
from tilecast.executor.tiles import TileStore


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--tile", type=int, default=8)
    ap.add_argument("--sched", default="eager")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    g = tiled_matmul_gelu(args.size, args.size, args.size, args.tile)
    store = TileStore(g)
    store.allocate_all()
    n = g.n_tasks
    base, ours = [], []
    with StarPUSession(args.sched, args.workers) as s:
        s.execute(g, store, dry=True)  # warm up both paths
        s.baseline(g, store)
        for _ in range(args.repeats):  # interleaved, so that load from other processes hits both alike
            base.append(s.baseline(g, store))
            t0 = time.perf_counter()
            s.execute(g, store, dry=True)
            ours.append(time.perf_counter() - t0)
    b_us = 1e6 * float(np.median(base)) / n
    t_us = 1e6 * float(np.median(ours)) / n
    res = dict(tasks=n, tiles=g.n_tiles, sched=args.sched, workers=args.workers,
               starpu_us_per_task=round(b_us, 3), tilecast_total_us_per_task=round(t_us, 3),
               tilecast_own_us_per_task=round(t_us - b_us, 3))
    print(f"{'tasks':>8} {'sched':>8} {'StarPU alone':>14} {'tilecast total':>15} {'tilecast own':>13}  (µs/task)")
    print(f"{n:>8} {args.sched:>8} {b_us:>14.2f} {t_us:>15.2f} {t_us - b_us:>13.2f}")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
