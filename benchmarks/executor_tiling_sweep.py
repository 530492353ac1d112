"""Which tiling runs a GEMM-dominated GPT-2 step fastest on StarPU here (the tiling for executor_vs_torch.py).

Model as in ``executor_vs_torch.py``: n_embd 768, 12 heads, vocabulary 50257,
``--layers`` layers, batch 4 x 256 tokens, float32, AdamW. Every candidate
tiling keeps its own graph and tiles on one StarPU session; the candidates run
round-robin, one step each per round, so that load from other processes
spreads over all of them, and each is ranked by its median step time (the
first round, a warm-up, left out). numpy's float32 GEMM rate (2048^3, best of
3, on ``--workers`` threads) is measured every round, so that each tiling's
achieved GFLOP/s reads as a share of it.

Prints a table, then one JSON line (``best``, and per tiling ``step_s``,
``gflops``, ``gemm_share``, ``tasks``).
Usage: python3 benchmarks/executor_tiling_sweep.py [--sched lws] [--rounds 3] [--tiles 'batch=2,vocab=4096;256']
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from threadpoolctl import threadpool_limits

from tilecast.executor.starpu_run import StarPUTraining
from tilecast.executor.starpu_session import StarPUSession
from tilecast.reference.step import TrainState, init_gpt2_params
from tilecast.graph import Tiling
from tilecast.graph.gpt2 import AdamWConfig, build_gpt2_step
from tilecast.graph.model_config import ModelConfig
from tilecast.perfmodel.local import conditions_line, run_conditions

CANDIDATES = "batch=1;batch=2;batch=4;batch=2,vocab=4096;batch=1,seq=128;256"


def gemm_gflops(threads: int, a: np.ndarray) -> float:
    with threadpool_limits(limits=threads, user_api="blas"):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            a @ a
            best = min(best, time.perf_counter() - t0)
    return 2 * a.shape[0] ** 3 / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--sched", default="lws")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds after the warm-up round")
    ap.add_argument("--tiles", default=CANDIDATES, help="candidate tilings separated by ';'")
    args = ap.parse_args()
    conditions = run_conditions()
    print(conditions_line(conditions))
    cfg = ModelConfig(n_layer=args.layers, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
    tiles = [t.strip() for t in args.tiles.split(";") if t.strip()]
    data = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(args.rounds + 1, args.batch, args.seq + 1))
    a = np.random.default_rng(1).standard_normal((2048, 2048)).astype(np.float32)
    times = {t: [] for t in tiles}
    gemm = []
    with StarPUSession(args.sched, args.workers) as session:
        runs = {}
        for t in tiles:
            graph = build_gpt2_step(cfg, args.batch, args.seq, Tiling.parse(t), AdamWConfig(lr=1e-4))
            runs[t] = StarPUTraining(session, graph, TrainState(init_gpt2_params(cfg, 0)), data)
        for r in range(args.rounds + 1):
            for t in tiles:
                seconds = runs[t].step(trace=False)[0]
                if r:
                    times[t].append(seconds)
            if r:
                gemm.append(gemm_gflops(args.workers, a))
        flops = {t: float(run.graph.flops.sum()) for t, run in runs.items()}
        tasks = {t: run.graph.n_tasks for t, run in runs.items()}
    peak = float(np.median(gemm))
    table = {t: dict(step_s=float(np.median(s)), gflops=flops[t] / float(np.median(s)) / 1e9, tasks=tasks[t])
             for t, s in times.items()}
    for row in table.values():
        row["gemm_share"] = row["gflops"] / peak
    best = min(table, key=lambda t: table[t]["step_s"])
    print(f"n_embd 768, {args.layers} layers, vocab 50257; batch {args.batch} x {args.seq}; {args.sched} on "
          f"{args.workers} workers; numpy GEMM {peak:.1f} GFLOP/s (median of {len(gemm)} rounds)")
    print(f"{'tiling':<24}{'tasks':>7}{'step s':>9}{'GFLOP/s':>9}{'of GEMM':>9}")
    for t, row in sorted(table.items(), key=lambda kv: kv[1]["step_s"]):
        print(f"{t:<24}{row['tasks']:>7}{row['step_s']:>9.3f}{row['gflops']:>9.1f}{row['gemm_share']:>9.0%}")
    print(json.dumps(dict(best=best, sched=args.sched, workers=args.workers, layers=args.layers,
                          gemm_gflops=peak, tilings=table, conditions=conditions)))


if __name__ == "__main__":
    main()
