"""dmdasd's steps with the priority range tilecast declares, beside the same steps without it.

StarPU 1.3.10's dmdasd decides where a ready task goes from the predicted
work queued ahead of it on every worker. Without a declared priority range
it walks each worker's queue and reads every queued task's predicted length,
under that worker's lock (``_starpu_fifo_get_exp_len_prev_task_list``,
src/sched_policies/fifo_queues.c); with one (``STARPU_MIN_PRIO`` and
``STARPU_MAX_PRIO``) it reads one running sum per worker and priority level
(``exp_len_per_priority``, src/sched_policies/deque_modeling_policy_data_aware.c).
tilecast declares ``tilecast.graph.priorities.DECLARED_LEVELS`` levels for
dmdasd; ``TILECAST_PRIORITY_LEVELS=0`` declares none, as StarPU runs by
default.

Each configuration runs under ``tilecast run --json`` with the declared range
and without it, alternated, ``--rounds`` times each; a run's step is the median
of its steps after the first (a warm-up). Printed: the conditions (CPU, BLAS
core), per configuration both medians over the rounds and their ratio; last
line one JSON object (``rows``, ``speedup_median``, ``conditions``).

    python3 benchmarks/dmdasd_priority_range.py                 # the accuracy suite's gpt2-4x128 and Llama
    python3 benchmarks/dmdasd_priority_range.py --rounds 5 --steps 8
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

GPT2_4X128 = {"name": "gpt2-4x128", "n_layer": 4, "n_embd": 128, "n_head": 4, "vocab_size": 2048,
              "n_positions": 256}
LLAMA_3X192 = {"name": "llama-3x192", "family": "llama", "n_layer": 3, "n_embd": 192, "n_head": 6, "n_kv_head": 2,
               "intermediate_size": 512, "vocab_size": 2000, "n_positions": 256}
# (model, batch, seq, tiling): the accuracy suite's shapes of many small tasks, at its dmdasd tilings and one more
CONFIGS = [(GPT2_4X128, 8, 64, "32"), (GPT2_4X128, 8, 64, "48"), (LLAMA_3X192, 4, 96, "96")]


def one_run(model: dict, batch: int, seq: int, tile: str, workers: int, steps: int, declared: bool,
            timeout: float) -> dict:
    """One ``tilecast run --json`` of dmdasd: its median step after the first, tasks and BLAS."""
    env = dict(os.environ)
    if declared:
        env.pop("TILECAST_PRIORITY_LEVELS", None)
    else:
        env["TILECAST_PRIORITY_LEVELS"] = "0"
    cmd = [sys.executable, "-m", "tilecast", "run", "--model", json.dumps(model), "--batch", str(batch), "--seq",
           str(seq), "--tile", tile, "--sched", "dmdasd", "--workers", str(workers), "--steps", str(steps),
           "--json"]
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        sys.exit(f"dmdasd_priority_range: a run took more than {timeout:.0f} s: {' '.join(cmd[3:])}")
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["(no message)"])[-1]
        sys.exit(f"dmdasd_priority_range: tilecast run failed ({r.returncode}): {last}")
    out = json.loads(r.stdout)
    return {"step_s": float(np.median(out["step_times_s"][1:])), "tasks": out["tasks"], "blas": out.get("blas")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="runs of each setting, alternated (default 3)")
    ap.add_argument("--steps", type=int, default=6, help="steps per run, the first a warm-up (default 6)")
    ap.add_argument("--workers", default="1,2", help="worker counts, comma-separated (default 1,2)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds one run may take (default 600)")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.steps < 2:
        ap.error("--rounds must be at least 1 and --steps at least 2 (the first step is a warm-up)")
    try:
        workers = [int(w) for w in args.workers.split(",")]
    except ValueError:
        ap.error(f"--workers: expected comma-separated whole numbers, got {args.workers!r}")
    from tilecast.graph.priorities import DECLARED_LEVELS, declared_range
    from tilecast.perfmodel.local import cpu_count, cpu_model

    os.environ.pop("TILECAST_PRIORITY_LEVELS", None)
    span = declared_range("dmdasd")
    conditions = {"cpu": cpu_model(), "cores": cpu_count(), "declared_levels": DECLARED_LEVELS,
                  "declared_range": list(span), "load_average_start": os.getloadavg()[0]}
    rows = []
    for model, batch, seq, tile in CONFIGS:
        for w in workers:
            runs = {True: [], False: []}
            for i in range(args.rounds):
                for declared in ((False, True) if i % 2 == 0 else (True, False)):
                    runs[declared].append(one_run(model, batch, seq, tile, w, args.steps, declared, args.timeout))
            conditions.setdefault("blas", runs[True][0]["blas"])
            none, decl = (float(np.median([r["step_s"] for r in runs[d]])) for d in (False, True))
            row = {"model": model["name"], "batch": batch, "seq": seq, "tile": tile, "workers": w,
                   "tasks": runs[True][0]["tasks"], "step_none_s": none, "step_declared_s": decl,
                   "steps_none_s": [r["step_s"] for r in runs[False]],
                   "steps_declared_s": [r["step_s"] for r in runs[True]], "speedup": none / decl}
            rows.append(row)
            print(f"{row['model']:12s} {batch}x{seq} tile {tile:>3s} w{w} ({row['tasks']} tasks): "
                  f"no range {none * 1e3:7.1f} ms, declared {decl * 1e3:7.1f} ms: {none / decl:.2f}x", flush=True)
    blas = conditions.get("blas") or {}
    print(f"CPU {conditions['cpu']} ({conditions['cores']} cores); BLAS {blas}; dmdasd levels declared: "
          f"{DECLARED_LEVELS} ({span[0]}..{span[1]}); load average at start {conditions['load_average_start']:.1f}")
    out = {"rows": rows, "speedup_median": float(np.median([r["speedup"] for r in rows])), "conditions": conditions}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
