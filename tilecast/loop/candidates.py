"""The configurations ``tilecast tune`` searches: tilings, schedulers, worker counts.

Tilings are uniform tile sizes (powers of two from 32 up to the step's largest
dimension, where the whole step is a single tile) and, for each size, the same
with the batch and sequence dimensions left whole (fewer, larger GEMMs over
the tokens). Sizes that give the same tiles as a smaller one are dropped.
"""

from __future__ import annotations

from tilecast.graph import Tiling
from tilecast.graph.tiling import DIMS

DEFAULT_SCHEDS = ("eager", "prio", "ws", "lws", "dmda", "dmdas")


def dims_of(cfg, batch: int, seq: int) -> dict:
    return {"batch": batch, "seq": seq, "embd": cfg.n_embd, "head": cfg.n_head, "inner": cfg.n_inner,
            "vocab": cfg.vocab_size}


def effective(tiling: Tiling, dims: dict) -> tuple:
    """The tile size each dimension really gets (sizes above a dimension mean untiled)."""
    return tuple(tiling.tile(d, dims[d]) for d in DIMS)


def candidate_tilings(cfg, batch: int, seq: int, smallest: int = 32, head_sizes: bool = False) -> list[Tiling]:
    """Distinct tilings to search, from the finest to the coarsest."""
    dims = dims_of(cfg, batch, seq)
    largest = max(v for d, v in dims.items() if d != "head")
    out, seen = [], set()
    size = smallest
    while True:
        for t in (Tiling.uniform(size), Tiling({d: size for d in ("embd", "inner", "vocab")})):
            key = effective(t, dims)
            if key not in seen:
                seen.add(key)
                out.append(t)
        if size >= largest:
            break
        size *= 2
    return out


def worker_counts(max_workers: int) -> list[int]:
    return list(range(1, max_workers + 1))


def short_label(tiling: Tiling) -> str:
    """``64`` for a uniform tiling, else the named sizes (``embd=64,inner=64,vocab=64``)."""
    sizes = set(tiling.sizes.values())
    if len(tiling.sizes) == len(DIMS) and len(sizes) == 1:
        return str(sizes.pop())
    return tiling.describe()
