"""The same training step on 1, 2 and 4 StarPU-MPI ranks: step time, bytes moved, cost per message.

For each distribution and rank count, ``tilecast.executor.mpi_launch.run_mpi``
runs ``--steps`` steps (one CPU worker per rank) and reports the median step
time after the first (the slowest rank, from a barrier to every task and
message done), the bytes StarPU-MPI counted as sent in a step
(``STARPU_COMM_STATS``) beside the insert-task model's figure, the messages
per step (model), and the step time added per message: (step time at N ranks
- step time at 1 rank) / messages. That last figure lumps together what a
message costs StarPU-MPI (requests, the progress thread, Open MPI's shared
memory copy) and what waiting for it costs the critical path; on a machine
with fewer cores than threads (each rank has a worker, a progress thread and
its submitting thread) it also holds the operating system's time slices.
Rank counts a distribution cannot use (more ranks than layers) are left out.

Prints the run's conditions, a table, then one JSON line (``rows``: ranks,
distribution, step_s, bytes_moved, bytes_moved_predicted, messages,
added_s_per_message, tasks_per_rank; ``conditions``; ``load_average``).

    python3 benchmarks/mpi_scaling.py [--steps 5] [--ranks 1,2,4] [--distributions data,layer]
"""

from __future__ import annotations

import argparse
import json
import os

from tilecast.executor.mpi_launch import run_mpi
from tilecast.graph import Tiling
from tilecast.graph.model_config import load_model
from tilecast.perfmodel.local import conditions_line, run_conditions

MODEL = '{"n_layer":4,"n_embd":128,"n_head":4,"vocab_size":512,"n_positions":128}'
BATCH, SEQ, TILE, SCHED = 4, 64, "64,batch=1", "lws"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--distributions", default="data,layer")
    args = ap.parse_args()
    conditions = run_conditions()
    print(conditions_line(conditions))
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    cfg, tiling = load_model(MODEL), Tiling.parse(TILE)
    print(f"model {MODEL}, batch {BATCH} x {SEQ}, tiling {TILE}, {SCHED}, 1 worker per rank, {args.steps} steps")
    rows, base = [], {}
    print(f"{'distribution':<13}{'ranks':>6}{'step ms':>10}{'moved':>12}{'model':>12}{'msgs':>7}"
          f"{'+ms/msg':>9}{'tasks per rank':>24}")
    for dist in args.distributions.split(","):
        for ranks in (int(r) for r in args.ranks.split(",")):
            try:
                r = run_mpi(cfg, BATCH, SEQ, tiling, SCHED, 1, args.steps, ranks, dist, timeout_s=900)
            except ValueError as e:
                print(f"{dist:<13}{ranks:>6}  left out: {e}")
                continue
            step = r.median_step_s
            base.setdefault(dist, step if ranks == 1 else None)
            msgs = r.predicted["messages"]
            added = (step - base[dist]) / msgs if msgs and base.get(dist) else None
            row = dict(ranks=ranks, distribution=dist, step_s=step, bytes_moved=r.bytes_moved[-1],
                       bytes_moved_predicted=r.predicted["bytes_moved"], messages=msgs, added_s_per_message=added,
                       tasks_per_rank=r.executed[:, -1].tolist())
            rows.append(row)
            print(f"{dist:<13}{ranks:>6}{1e3 * step:>10.2f}{row['bytes_moved']:>12}{row['bytes_moved_predicted']:>12}"
                  f"{msgs:>7}{'' if added is None else f'{1e3 * added:.3f}':>9}{str(row['tasks_per_rank']):>24}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(json.dumps({"rows": rows, "conditions": conditions, "load_average": os.getloadavg()[0],
                      "model": MODEL, "batch": BATCH, "seq": SEQ, "tiling": TILE, "sched": SCHED,
                      "steps": args.steps, "median_of": "steps after the first"}))


if __name__ == "__main__":
    main()
