"""Time a training step spends outside its task graph (host time), against the target.

A step's time is from the moment the training loop starts it (loading the
batch) until its last task is known to be done; its makespan runs from the
graph's submission to the last task's end. The difference is host time:
loading the batch, the handles' bookkeeping, waking the waiting thread,
releasing the tasks. Target: at most 2% of the step or 1 ms, whichever is
larger. Medians over ``--steps`` steps after two warm-up steps.

Prints a table, then one JSON line (``rows`` with step_s, makespan_s, host_s,
limit_s, met; ``targets_met``).

    python3 benchmarks/host_time.py [--steps 20] [--workers 2]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from tilecast.executor.starpu_run import run_steps
from tilecast.graph import Tiling
from tilecast.graph.model_config import load_model
from tilecast.perfmodel.local import conditions_line, run_conditions

CONFIGS = [  # (model, batch, seq, tiling, scheduler): short steps first, where host time weighs most
    ("gpt2-tiny", 8, 128, "64", "eager"),
    ('{"n_layer":3,"n_embd":96,"n_head":3,"vocab_size":500,"n_positions":256}', 6, 96, "48", "eager"),
    ("gpt2-tiny", 32, 128, "64", "dmda"),
    ('{"n_layer":2,"n_embd":384,"n_head":6,"vocab_size":4000,"n_positions":512}', 4, 128, "64", "lws"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    conditions = run_conditions()
    print(conditions_line(conditions))
    rows = []
    print(f"{'model':<12}{'batch':>8}{'tile':>6}{'sched':>7}{'tasks':>7}{'step ms':>10}{'mksp ms':>10}{'host ms':>9}"
          f"{'limit ms':>10}{'met':>5}")
    for model, batch, seq, tile, sched in CONFIGS:
        cfg = load_model(model)
        r = run_steps(cfg, batch, seq, Tiling.parse(tile), sched, args.workers, args.steps + 2)
        step = float(np.median(r.step_s[2:]))
        span = float(np.median(r.makespan_s[2:]))
        host = float(np.median(np.subtract(r.step_s[2:], r.makespan_s[2:])))
        limit = max(0.02 * step, 1e-3)
        row = dict(model=cfg.shape() if hasattr(cfg, "shape") else model, batch=batch, seq=seq, tiling=tile,
                   sched=sched, tasks=r.n_tasks, step_s=step, makespan_s=span, host_s=host, limit_s=limit,
                   met=host <= limit)
        rows.append(row)
        print(f"{cfg.name[:12]:<12}{batch:>4}x{seq:<3}{tile:>6}{sched:>7}{r.n_tasks:>7}{1e3 * step:>10.2f}"
              f"{1e3 * span:>10.2f}{1e3 * host:>9.2f}{1e3 * limit:>10.2f}{'yes' if row['met'] else 'NO':>5}")
    print(json.dumps({"rows": rows, "targets_met": all(r["met"] for r in rows), "workers": args.workers,
                      "conditions": conditions}))


if __name__ == "__main__":
    main()
