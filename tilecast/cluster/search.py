"""Search parallel layouts for a model on a number of GPUs, under the memory limit."""

from __future__ import annotations

import sys

import numpy as np

from tqdm import tqdm

from tilecast.cluster.evaluate import evaluate
from tilecast.cluster.memory import memory_per_gpu
from tilecast.cluster.strategy import Strategy, StrategyError


def _divisors(n: int, limit: int) -> list:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def candidates(shape, cluster, gpus: int, seq: int, global_batch: int, dtype: str = "bf16",
               attention: str = "flash", micro_batches=(1, 2, 4, 8), max_pp: int = 64) -> list:
    """Every layout worth trying: TP inside a node, PP over divisors of the layer count,
    DP the rest; micro-batch, ZeRO stage, schedule and recomputation varied."""
    out = []
    for tp in _divisors(cluster.gpus_per_node, cluster.gpus_per_node):
        if shape.n_head % tp or gpus % tp:
            continue
        for pp in _divisors(shape.n_layer, max_pp):
            if gpus % (tp * pp):
                continue
            dp = gpus // (tp * pp)
            for mb in micro_batches:
                if global_batch % (dp * mb):
                    continue
                m = global_batch // (dp * mb)
                schedules = [("1f1b", 1)]
                if pp > 1 and m % pp == 0 and shape.n_layer % (pp * 2) == 0:
                    schedules.append(("interleaved", 2))
                zeros = (0, 1, 2, 3) if pp == 1 else (0, 1)
                for zero in zeros:
                    if dp == 1 and zero:
                        continue
                    for sched, v in schedules:
                        for rec in ("none", "selective", "full"):
                            st = Strategy(tp=tp, pp=pp, dp=dp, seq=seq, global_batch=global_batch, micro_batch=mb,
                                          zero=zero, schedule=sched, virtual_stages=v, recompute=rec,
                                          sequence_parallel=tp > 1, dtype=dtype, attention=attention)
                            try:
                                st.check(shape, cluster)
                            except StrategyError:
                                continue
                            out.append(st)
    return out


def search(shape, cluster, gpus: int, seq: int, global_batch: int, *, top: int = 10, max_configs: int = 1000,
           progress: bool = True, **kw) -> dict:
    """Simulate the layouts that fit in memory and return the ``top`` fastest.

    When more than ``max_configs`` fit, an evenly spaced subset of them (in
    enumeration order: TP, PP, micro-batch, ZeRO, schedule, recomputation) is
    simulated, so every region of the space keeps representatives.
    """
    cands = candidates(shape, cluster, gpus, seq, global_batch, **kw)
    fitting = [st for st in cands if memory_per_gpu(shape, st, cluster).total <= cluster.gpu.memory_bytes]
    if len(fitting) > max_configs:
        idx = np.unique(np.linspace(0, len(fitting) - 1, max_configs).round().astype(int))
        evaluated = [fitting[i] for i in idx]
    else:
        evaluated = fitting
    results = []
    for st in tqdm(evaluated, desc="layouts", file=sys.stderr, disable=not progress, leave=False):
        results.append(evaluate(shape, st, cluster))
    results.sort(key=lambda r: -r.tokens_per_s)
    return {"candidates": len(cands), "fitting": len(fitting), "evaluated": len(evaluated), "top": results[:top]}
