"""Where a step's host time goes: the executor's timeline of each step, for host_time.py's configurations.

Every step is split at the marks the executor keeps (``StarPUTraining.marks``,
monotonic clock): before the makespan's origin (``batch``: the new batch
written; ``prepare``: the graph's arrays, priorities, tile handles;
``to_origin``: the submitting call to the first submission), inside it
(``to_first``: the origin to the first task's start; ``graph``: the first
start to the last end) and after it (``to_callback``: the last task's end to
its callback; ``to_wake``: that callback to the waiting thread's wake-up;
``to_python``: to the wait's return in Python; ``pause``: pausing the workers;
``wait_all``: StarPU's wait for every task's termination; ``to_end``: to the
step's end). ``host`` is the step less its makespan; ``between`` is the loss
read and the loop's own time up to the next step's start (outside the step).
No step is traced. Prints, per configuration, the median and the 90th
percentile of each part over ``--steps`` steps after two warm-ups, then one JSON line.

    python3 benchmarks/host_timeline.py [--steps 40] [--workers 2] [--rows 0,1]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

PARTS = [("batch", "step_start", "batch_loaded"), ("prepare", "batch_loaded", "submit_called"),
         ("to_origin", "submit_called", "origin"), ("to_first", "origin", "first_start"),
         ("graph", "first_start", "last_end"), ("to_callback", "last_end", "last_callback"),
         ("to_wake", "last_callback", "woken"), ("to_python", "woken", "wait_returned"),
         ("pause", "wait_returned", "paused"), ("wait_all", "paused", "all_done"), ("to_end", "all_done", "done")]


def timeline(cfg, batch, seq, tiling, sched, workers, steps) -> list[dict]:
    """Per step (after two warm-ups), its parts in seconds, ``host`` and ``between``."""
    from tilecast.executor.starpu_run import StarPUTraining
    from tilecast.executor.starpu_session import StarPUSession
    from tilecast.graph.models import build_step
    from tilecast.reference.step import TrainState, init_params

    graph = build_step(cfg, batch, seq, tiling)
    data = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(steps + 2, batch, seq + 1))
    marks = []
    with StarPUSession(sched, workers) as session:
        training = StarPUTraining(session, graph, TrainState(init_params(cfg, 0)), data)
        for _ in range(steps + 2):
            training.step(trace=False)
            marks.append(training.marks)
    rows = []
    for t in range(2, steps + 2):
        m = marks[t]
        row = {name: m[b] - m[a] for name, a, b in PARTS}
        row["host"] = (m["done"] - m["step_start"]) - (m["last_end"] - m["origin"])
        row["between"] = marks[t + 1]["step_start"] - m["done"] if t + 1 < len(marks) else float("nan")
        rows.append(row)
    return rows


def main() -> int:
    from host_time import CONFIGS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rows", default=",".join(str(i) for i in range(len(CONFIGS))),
                    help="host_time.py's rows to run, by index (default: all)")
    args = ap.parse_args()
    if args.steps < 1:
        ap.error(f"--steps: at least 1, got {args.steps}")
    try:
        picked = [CONFIGS[int(i)] for i in args.rows.split(",")]
    except (ValueError, IndexError):
        ap.error(f"--rows: indices 0-{len(CONFIGS) - 1} separated by commas, got {args.rows!r}")
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model
    from tilecast.perfmodel.local import conditions_line, run_conditions

    conditions = run_conditions()
    print(conditions_line(conditions))
    out = []
    names = [p[0] for p in PARTS] + ["host", "between"]
    for model, batch, seq, tile, sched in picked:
        cfg = load_model(model)
        load = os.getloadavg()[0]
        rows = timeline(cfg, batch, seq, Tiling.parse(tile), sched, args.workers, args.steps)
        med = {k: 1e3 * float(np.nanmedian([r[k] for r in rows])) for k in names}
        p90 = {k: 1e3 * float(np.nanpercentile([r[k] for r in rows], 90)) for k in names}
        print(f"{cfg.name} {batch}x{seq} tile {tile} {sched}, {args.workers} workers, {len(rows)} steps, "
              f"load average {load:.1f}")
        print("  " + "".join(f"{k:>12}" for k in names))
        print("  " + "".join(f"{med[k]:>12.3f}" for k in names) + "   median ms")
        print("  " + "".join(f"{p90[k]:>12.3f}" for k in names) + "   p90 ms")
        out.append({"model": cfg.name, "batch": batch, "seq": seq, "tiling": tile, "sched": sched,
                    "median_ms": med, "p90_ms": p90, "load_average": load})
    print(json.dumps({"rows": out, "steps": args.steps, "workers": args.workers, "conditions": conditions}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
