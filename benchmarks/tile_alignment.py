"""What 64-byte-aligned tiles buy: one StarPU step on aligned tiles and on the same tiles 16 bytes off a line.

The same graph, session and values run on two tile stores in turn, step by
step, so that load from other processes hits both alike: the store's own
64-byte-aligned buffers, and copies that start 16 bytes past a cache line
(``--offset``; 16 is where numpy's allocator puts large arrays). Reports the
median makespan of each and their ratio (misaligned / aligned: above 1 means
alignment helps), with the load average before and after.

    python3 benchmarks/tile_alignment.py [--model gpt2|llama] [--layers 2] [--tile 512] [--sched prio]
                                         [--workers 2] [--steps 6] [--offset 16]

Last line: one JSON object (aligned_s, misaligned_s: median makespans in
seconds; ratio; steps; tasks; loadavg: the 1-minute load average before and
after; and the settings).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from tilecast.executor.starpu_session import StarPUSession
from tilecast.graph import Tiling
from tilecast.graph.model_config import load_model
from tilecast.graph.models import build_step
from tilecast.perfmodel.local import conditions_line, run_conditions
from tilecast.reference.step import TrainState, init_params, load_step
from tilecast.reference.tiles import TILE_ALIGN, TileStore

SHAPES = {"gpt2": dict(n_embd=768, n_head=12, vocab_size=50257, n_positions=1024),
          "llama": dict(family="llama", n_embd=768, n_head=12, n_kv_head=4, intermediate_size=2048,
                        vocab_size=50257, n_positions=1024)}


def moved(a: np.ndarray, offset: int) -> np.ndarray:
    """A copy of flat ``a`` whose data starts ``offset`` bytes past a 64-byte boundary."""
    raw = np.empty(a.nbytes + 2 * TILE_ALIGN, np.uint8)
    start = (-raw.__array_interface__["data"][0]) % TILE_ALIGN + offset
    out = raw[start:start + a.nbytes].view(a.dtype)
    out[:] = a
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(SHAPES), default="gpt2")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--tile", default="512", help="tiling (default 512)")
    ap.add_argument("--sched", default="prio")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6, help="timed steps of each store, after one warm-up each")
    ap.add_argument("--offset", type=int, default=16, help="bytes past a line for the misaligned copies (1-63)")
    args = ap.parse_args()
    if not 0 < args.offset < TILE_ALIGN:
        ap.error(f"--offset: between 1 and {TILE_ALIGN - 1} bytes, got {args.offset}")
    if args.steps < 1:
        ap.error(f"--steps: at least 1, got {args.steps}")
    print(conditions_line(run_conditions()))
    cfg = load_model(json.dumps(dict(n_layer=args.layers, **SHAPES[args.model])))
    graph = build_step(cfg, args.batch, args.seq, Tiling.parse(args.tile))
    rng = np.random.default_rng(0)
    data = rng.integers(0, cfg.vocab_size, size=(args.batch, args.seq + 1))
    aligned = load_step(graph, TrainState(init_params(cfg, 0)), data[:, :-1], data[:, 1:])
    aligned.allocate_all()
    off = TileStore(graph)
    off.buffers = [moved(b, args.offset) for b in aligned.buffers]
    stores = {"aligned": aligned, "misaligned": off}
    load0 = os.getloadavg()[0]
    spans = {k: [] for k in stores}
    with StarPUSession(args.sched, args.workers) as session:
        for step in range(args.steps + 1):
            for name in (("aligned", "misaligned") if step % 2 else ("misaligned", "aligned")):
                t0 = time.perf_counter()
                session.execute(graph, stores[name], trace=False)
                if step:  # the first of each is a warm-up
                    spans[name].append(session.last_makespan_s or time.perf_counter() - t0)
    load1 = os.getloadavg()[0]
    a, m = float(np.median(spans["aligned"])), float(np.median(spans["misaligned"]))
    print(f"{args.model}, {args.layers} layers, batch {args.batch} x {args.seq}, tile {args.tile}, {args.sched} on "
          f"{args.workers} workers, {graph.n_tasks} tasks; load average {load0:.1f} before, {load1:.1f} after")
    print(f"{'tiles':<28}{'median makespan s':>18}")
    print(f"{'64-byte aligned':<28}{a:>18.4f}")
    print(f"{f'{args.offset} bytes past a line':<28}{m:>18.4f}")
    print(f"misaligned / aligned: {m / a:.3f}")
    print(json.dumps(dict(model=args.model, layers=args.layers, batch=args.batch, seq=args.seq, tile=args.tile,
                          sched=args.sched, workers=args.workers, offset=args.offset, steps=args.steps,
                          tasks=graph.n_tasks, aligned_s=round(a, 5), misaligned_s=round(m, 5),
                          ratio=round(m / a, 4), loadavg=[round(load0, 2), round(load1, 2)],
                          aligned_steps_s=[round(x, 5) for x in spans["aligned"]],
                          misaligned_steps_s=[round(x, 5) for x in spans["misaligned"]])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
