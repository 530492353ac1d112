"""One GPT-2 training step on StarPU against PyTorch eager, and both against the machine's GEMM rate.

In one process, on the same threads: a GPT-2-shaped model where GEMMs dominate
(default n_embd 768, 12 heads, GPT-2's vocabulary, 2 layers; batch 4 x 256
tokens), float32, AdamW. StarPU runs tilecast's step graph (``--workers`` CPU
workers, one BLAS thread each); PyTorch runs transformers' GPT2LMHeadModel
with ``torch.set_num_threads(--workers)``. The steps alternate (one StarPU, one
PyTorch) so that load from other processes hits both alike; figures are
medians after one warm-up step each. The GEMM rate is numpy's float32 matmul of
two 2048 x 2048 matrices on the same number of BLAS threads, measured between
the steps too (median over the rounds of the best of 3 products).

Both sides are credited with the same work: the flops of tilecast's step graph.
``--sweep`` first times one step of each candidate tiling and keeps the fastest.

Prints a table, then one JSON line with ``starpu_tokens_per_s``,
``torch_tokens_per_s``, ``ratio`` and ``gemm_share``.
Usage: python3 benchmarks/executor_vs_torch.py [--tile batch=2,vocab=4096] [--sched lws] [--sweep]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from tilecast.executor.starpu_session import StarPUSession
from tilecast.executor.step import TrainState, init_gpt2_params, load_step
from tilecast.graph import Tiling
from tilecast.graph.gpt2 import AdamWConfig, build_gpt2_step
from tilecast.graph.model_config import ModelConfig

CANDIDATES = ["batch=1", "batch=2", "batch=1,vocab=8192", "batch=1,inner=1536", "batch=1,seq=128",
              "batch=1,seq=128,vocab=8192", "batch=2,vocab=4096", "256"]


class GemmRate:
    """numpy's float32 GEMM rate in GFLOP/s (2 n^3 flops per product) on ``threads`` BLAS threads."""

    def __init__(self, threads: int, n: int = 2048):
        rng = np.random.default_rng(0)
        self.a, self.b = rng.random((n, n), dtype=np.float32), rng.random((n, n), dtype=np.float32)
        self.threads, self.flops = threads, 2 * n**3
        self()

    def __call__(self, repeats: int = 3) -> float:
        """The best of ``repeats`` products (the least disturbed by other processes)."""
        with threadpool_limits(limits=self.threads, user_api="blas"):
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                self.a @ self.b
                times.append(time.perf_counter() - t0)
        return self.flops / min(times) / 1e9


def blas_libraries() -> list[dict]:
    """Every BLAS loaded in this process (numpy's and the one the C kernels link), with its kernel."""
    return [{k: lib.get(k) for k in ("internal_api", "version", "architecture", "num_threads", "filepath")}
            for lib in threadpool_info() if lib.get("user_api") == "blas"]


class TorchStep:
    def __init__(self, cfg: ModelConfig, batch: int, seq: int, threads: int, lr: float):
        import torch

        from tilecast.executor.verify import hf_model

        torch.set_num_threads(threads)
        self.torch, self.cfg = torch, cfg
        self.model = hf_model(cfg, seed=0)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr)
        data = np.random.default_rng(1).integers(0, cfg.vocab_size, size=(batch, seq + 1))
        self.ids, self.targets = torch.from_numpy(data[:, :-1]), torch.from_numpy(data[:, 1:])

    def __call__(self) -> float:
        t0 = time.perf_counter()
        logits = self.model(self.ids).logits
        loss = self.torch.nn.functional.cross_entropy(logits.reshape(-1, self.cfg.vocab_size),
                                                      self.targets.reshape(-1))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return time.perf_counter() - t0


class StarPUStep:
    def __init__(self, session, cfg: ModelConfig, batch: int, seq: int, tiling: Tiling, lr: float):
        self.session = session
        self.graph = build_gpt2_step(cfg, batch, seq, tiling, AdamWConfig(lr=lr))
        state = TrainState(init_gpt2_params(cfg, seed=0))
        data = np.random.default_rng(1).integers(0, cfg.vocab_size, size=(batch, seq + 1))
        self.store = load_step(self.graph, state, data[:, :-1], data[:, 1:])
        self.step = 1

    def __call__(self) -> float:
        self.graph.set_param("adamw", "step", self.step)
        self.step += 1
        t0 = time.perf_counter()
        self.session.execute(self.graph, self.store)
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--tile", default="batch=2,vocab=4096",
                    help="tiling of the StarPU step (default: batch=2,vocab=4096, the fastest of the sweep here)")
    ap.add_argument("--sched", default="lws")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3, help="timed steps of each, after one warm-up step")
    ap.add_argument("--sweep", action="store_true", help="time one step of each candidate tiling, keep the best")
    args = ap.parse_args()
    cfg = ModelConfig(n_layer=args.layers, n_embd=args.embd, n_head=args.heads, vocab_size=args.vocab,
                      n_positions=max(1024, args.seq), name=f"gpt2-{args.layers}-layer")
    lr, tokens = 1e-4, args.batch * args.seq

    gemm_rate = GemmRate(args.workers)
    torch_step = TorchStep(cfg, args.batch, args.seq, args.workers, lr)
    sweep = {}
    with StarPUSession(args.sched, args.workers) as session:
        tile = args.tile
        if args.sweep:
            for cand in CANDIDATES:
                s = StarPUStep(session, cfg, args.batch, args.seq, Tiling.parse(cand), lr)
                s()
                sweep[cand] = min(s(), s())
                print(f"  tiling {cand:<22} {s.graph.n_tasks:>7} tasks  {sweep[cand]:.3f} s/step")
                del s
            tile = min(sweep, key=sweep.get)
        starpu_step = StarPUStep(session, cfg, args.batch, args.seq, Tiling.parse(tile), lr)
        n_tasks, flops = starpu_step.graph.n_tasks, float(starpu_step.graph.flops.sum())
        starpu_step()
        torch_step()
        sp, pt, gr = [], [], []
        for _ in range(args.steps):
            sp.append(starpu_step())
            pt.append(torch_step())
            gr.append(gemm_rate())
        blas = blas_libraries()  # now that both the kernels' BLAS and numpy's are loaded
    sp_s, pt_s, gemm = float(np.median(sp)), float(np.median(pt)), float(np.median(gr))
    res = dict(
        model=cfg.shape(), batch=args.batch, seq=args.seq, tiling=tile, sched=args.sched, workers=args.workers,
        tasks=n_tasks, gflop_per_step=flops / 1e9, starpu_step_s=sp_s, torch_step_s=pt_s,
        starpu_tokens_per_s=tokens / sp_s, torch_tokens_per_s=tokens / pt_s, ratio=pt_s / sp_s,
        starpu_gflops=flops / sp_s / 1e9, torch_gflops=flops / pt_s / 1e9, gemm_gflops=gemm,
        gemm_share=flops / sp_s / 1e9 / gemm, torch_gemm_share=flops / pt_s / 1e9 / gemm,
        sweep_step_s=sweep, blas=blas)
    print(f"{cfg.name} (n_embd {cfg.n_embd}, vocab {cfg.vocab_size}), batch {args.batch} x {args.seq}, "
          f"{args.workers} threads; {flops / 1e9:.1f} GFLOP per step")
    print(f"{'':<28}{'step s':>9}{'tokens/s':>10}{'GFLOP/s':>9}{'of GEMM':>9}")
    print(f"{f'StarPU {args.sched} tile {tile}':<28}{sp_s:>9.3f}{tokens / sp_s:>10.1f}{res['starpu_gflops']:>9.1f}"
          f"{res['gemm_share']:>9.0%}")
    print(f"{'PyTorch eager':<28}{pt_s:>9.3f}{tokens / pt_s:>10.1f}{res['torch_gflops']:>9.1f}"
          f"{res['torch_gemm_share']:>9.0%}")
    print(f"{'numpy GEMM 2048^3':<28}{'':>9}{'':>10}{gemm:>9.1f}{'100%':>9}")
    print(f"StarPU / PyTorch tokens/s: {res['ratio']:.2f}x (target 1.2x); StarPU share of GEMM rate: "
          f"{res['gemm_share']:.0%} (target 60%)")
    for lib in blas:
        print(f"BLAS: {lib['internal_api']} {lib['version']} kernel {lib['architecture']}, "
              f"{lib['num_threads']} threads ({lib['filepath']})")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
