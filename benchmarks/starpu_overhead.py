"""tilecast's own per-task cost on StarPU, against StarPU alone, on the same tasks.

Both sides run the same graph's tasks as empty codelets with the same handles
and access modes (so the same dependencies), on the same session:

- StarPU alone: tasks created with starpu_task_create and submitted in a C loop,
  no profiling, no callbacks (registration not counted);
- tilecast: ``StarPUSession.execute(graph, store, dry=True)``, the whole call as
  a user sees it in a training loop (same store every time, so the tiles stay
  registered; only changed buffers are re-registered): tile checks, bulk
  submission from the graph's arrays,
  profiling info per task, completion callbacks, unregistration and the trace
  DataFrame (also shown without the DataFrame, ``trace=False``; and StarPU
  alone with its per-task profiling switched on, which tilecast needs).

Prints a table, then one JSON line. Usage: python3 benchmarks/starpu_overhead.py [--tile 8] [--sched eager]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from tilecast.executor.sample_graphs import tiled_matmul_gelu
from tilecast.executor.starpu_session import StarPUSession
from tilecast.reference.tiles import TileStore
from tilecast.graph import Tiling
from tilecast.graph.gpt2 import build_gpt2_step
from tilecast.graph.model_config import load_model
from tilecast.perfmodel.local import conditions_line, run_conditions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=256, help="matrix size of the tiled matmul graph")
    ap.add_argument("--tile", default="8")
    ap.add_argument("--model", default=None, help="use a GPT-2 step graph of this model instead (with --tile)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--sched", default="eager")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    conditions = run_conditions()
    print(conditions_line(conditions))
    if args.model:
        g = build_gpt2_step(load_model(args.model), args.batch, args.seq, Tiling.parse(args.tile))
    else:
        g = tiled_matmul_gelu(args.size, args.size, args.size, int(args.tile))
    store = TileStore(g)
    store.allocate_all()
    for t in g.tensors:  # ids and targets must be valid token ids even though no kernel runs
        if t.dtype.kind == "i":
            for tid in range(t.first_tile, t.first_tile + t.n_tiles):
                store.buffers[tid][:] = 0
    n = g.n_tasks
    base, base_prof, ours, ours_c = [], [], [], []
    with StarPUSession(args.sched, args.workers) as s:
        s.execute(g, store, dry=True)  # warm up both paths
        s.baseline(g, store)
        for _ in range(args.repeats):  # interleaved, so that load from other processes hits both alike
            base.append(s.baseline(g, store))
            base_prof.append(s.baseline(g, store, profiling=True))
            t0 = time.perf_counter()
            s.execute(g, store, dry=True)
            ours.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            s.execute(g, store, dry=True, trace=False)
            ours_c.append(time.perf_counter() - t0)
    def us(x):
        return 1e6 * float(np.median(x)) / n

    b_us, bp_us, t_us, tc_us = us(base), us(base_prof), us(ours), us(ours_c)
    res = dict(tasks=n, tiles=g.n_tiles, sched=args.sched, workers=args.workers,
               starpu_us_per_task=round(b_us, 3), starpu_profiling_us_per_task=round(bp_us, 3),
               tilecast_total_us_per_task=round(t_us, 3), tilecast_no_table_us_per_task=round(tc_us, 3),
               tilecast_own_us_per_task=round(t_us - b_us, 3))
    print(f"µs per task, {n} tasks over {g.n_tiles} tiles, {args.sched} on {args.workers} workers")
    print(f"{'StarPU alone':>14} {'+ profiling':>12} {'tilecast, no table':>19} {'tilecast total':>15} "
          f"{'tilecast own':>13}")
    print(f"{b_us:>14.2f} {bp_us:>12.2f} {tc_us:>19.2f} {t_us:>15.2f} {t_us - b_us:>13.2f}")
    print(json.dumps({**res, "conditions": conditions}))


if __name__ == "__main__":
    main()
