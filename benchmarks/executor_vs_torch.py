"""One GPT-2-shaped training step on StarPU versus PyTorch eager, in one run on the same threads.

Model: n_embd 768, 12 heads, vocabulary 50257 (GPT-2 small's widths), fewer
layers to keep the run short; batch 4 x 256 tokens; float32; AdamW. Steps of
the two alternate (StarPU paused during torch's), so that load from other
processes hits both alike; figures are medians over the steps after the
first. numpy's SGEMM rate (2048^3, the same number of threads, measured
after each pair of steps; median) is the peak reference for the achieved GFLOP/s.

Prints a table, then one JSON line with starpu_tokens_per_s, torch_tokens_per_s,
ratio, gemm_share. Targets (issue): ratio >= 1.2 and gemm_share >= 0.6.

    python3 benchmarks/executor_vs_torch.py [--layers 2] [--tile batch=2,vocab=4096] [--sched lws] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from tilecast.executor.starpu_run import StarPUTraining
from tilecast.executor.starpu_session import StarPUSession
from tilecast.executor.step import TrainState, init_gpt2_params
from tilecast.graph import Tiling
from tilecast.graph.gpt2 import AdamWConfig, build_gpt2_step
from tilecast.graph.model_config import load_model
from tilecast.perfmodel.local import conditions_line, run_conditions


def gemm_rate(threads: int, n: int = 2048, repeats: int = 3) -> float:
    """numpy SGEMM GFLOP/s on ``threads`` threads (best of ``repeats``)."""
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    with threadpool_limits(threads):
        best = min(_timed(lambda: a @ a) for _ in range(repeats))
    return 2.0 * n ** 3 / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def torch_stepper(cfg, batch, seq, threads, data):
    import torch
    import transformers

    torch.set_num_threads(threads)
    conf = transformers.GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.n_positions, n_embd=cfg.n_embd,
                                   n_layer=cfg.n_layer, n_head=cfg.n_head, activation_function="gelu_new",
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(conf).float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = {"t": 0}

    def step():
        t = state["t"]
        ids = torch.from_numpy(data[t, :, :-1])
        targets = torch.from_numpy(data[t, :, 1:])
        t0 = time.perf_counter()
        logits = model(ids).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), targets.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        state["t"] += 1
        return time.perf_counter() - t0, float(loss.detach())

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--tile", default="batch=2,vocab=4096",
                    help="tiling (default: the fastest of benchmarks/executor_tiling_sweep.py here)")
    ap.add_argument("--sched", default="lws")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    conditions = run_conditions()
    print(conditions_line(conditions))
    cfg = load_model(json.dumps(dict(n_layer=args.layers, n_embd=768, n_head=12, vocab_size=50257,
                                     n_positions=1024)))
    data = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(args.steps, args.batch, args.seq + 1))
    graph = build_gpt2_step(cfg, args.batch, args.seq, Tiling.parse(args.tile), AdamWConfig(lr=1e-3))
    tokens = args.batch * args.seq
    flops = float(graph.flops.sum())
    torch_step = torch_stepper(cfg, args.batch, args.seq, args.workers, data)
    ours, theirs, peaks = [], [], []
    with StarPUSession(args.sched, args.workers) as session:
        training = StarPUTraining(session, graph, TrainState(init_gpt2_params(cfg, 0)), data)
        for _ in range(args.steps):
            ours.append(training.step(trace=False)[0])
            theirs.append(torch_step()[0])
            peaks.append(gemm_rate(args.workers))
    s_step = float(np.median(ours[1:] or ours))
    t_step = float(np.median(theirs[1:] or theirs))
    peak = float(np.median(peaks))
    s_tps, t_tps = tokens / s_step, tokens / t_step
    gflops = flops / s_step / 1e9
    blas = sorted({f"{i['internal_api']} {i.get('version')} {i.get('architecture')}" for i in threadpool_info()})
    res = dict(starpu_tokens_per_s=round(s_tps, 2), torch_tokens_per_s=round(t_tps, 2), ratio=round(s_tps / t_tps, 3),
               gemm_share=round(gflops / peak, 3), starpu_gflops=round(gflops, 2),
               torch_gflops=round(flops / t_step / 1e9, 2), gemm_gflops=round(peak, 2), starpu_step_s=round(s_step, 4),
               torch_step_s=round(t_step, 4), tiling=str(graph.meta.get("tiling", args.tile)), sched=args.sched,
               workers=args.workers, layers=args.layers, tasks=graph.n_tasks, blas=blas)
    print(f"model n_embd 768, {args.layers} layers, vocab 50257; batch {args.batch} x {args.seq}; "
          f"tile {args.tile}; {args.sched} on {args.workers} workers; {graph.n_tasks} tasks; BLAS: {'; '.join(blas)}")
    print(f"{'':<10}{'step s':>10}{'tokens/s':>12}{'GFLOP/s':>10}")
    print(f"{'StarPU':<10}{s_step:>10.3f}{s_tps:>12.1f}{gflops:>10.1f}")
    print(f"{'PyTorch':<10}{t_step:>10.3f}{t_tps:>12.1f}{flops / t_step / 1e9:>10.1f}")
    print(f"ratio {s_tps / t_tps:.2f}x; StarPU at {100 * gflops / peak:.0f}% of numpy's SGEMM rate ({peak:.0f} GFLOP/s)")
    print(json.dumps({**res, "conditions": conditions}))


if __name__ == "__main__":
    main()
