"""The configurations ``tilecast tune`` searches: tilings, schedulers, worker counts.

Tilings are uniform tile sizes (powers of two from 32 up to the step's largest
dimension, where the whole step is a single tile) and, for each size, the same
with the batch and sequence dimensions left whole (fewer, larger GEMMs over
the tokens). Sizes that give the same tiles as a smaller one are dropped.

A size in whole heads is rarely below the head count, so these tilings leave
the heads in one tile; where the sequence is also in at most two tiles, the
attention of a layer is one or a few tasks and all but one worker wait through
it. Each such tiling therefore also comes with its heads split in 2 and in 4
tiles (``head_splits``), the other dimensions unchanged: the GEMMs keep their
size, the attention gains tasks. A head tile holds whole groups of query heads
that share a key/value head (grouped-query attention).
"""

from __future__ import annotations

from collections import Counter

from tilecast.graph import Tiling
from tilecast.graph.tiling import DIMS

DEFAULT_SCHEDS = ("eager", "prio", "ws", "lws", "dmda", "dmdas")


def dims_of(cfg, batch: int, seq: int) -> dict:
    return {"batch": batch, "seq": seq, "embd": cfg.n_embd, "head": cfg.n_head, "inner": cfg.n_inner,
            "vocab": cfg.vocab_size}


def effective(tiling: Tiling, dims: dict) -> tuple:
    """The tile size each dimension really gets (sizes above a dimension mean untiled)."""
    return tuple(tiling.tile(d, dims[d]) for d in DIMS)


HEAD_TILE_COUNTS = (4, 2)  # the heads split in this many tiles, finest first


def head_splits(cfg) -> list[int]:
    """Head tile sizes (in query heads) that split the heads in about 2 and 4 tiles of whole
    key/value groups, finest first; sizes that leave one tile are left out."""
    group = cfg.n_head // cfg.n_kv_head if getattr(cfg, "n_kv_head", None) else 1
    groups = cfg.n_head // group
    out = []
    for parts in HEAD_TILE_COUNTS:
        size = group * -(-groups // parts)
        if size < cfg.n_head and size not in out:
            out.append(size)
    return out


def candidate_tilings(cfg, batch: int, seq: int, smallest: int = 32, split_heads: bool = True) -> list[Tiling]:
    """Distinct tilings to search, from the finest to the coarsest (a tiling with its heads split comes just
    before the same tiling with its heads whole); ``split_heads=False``: without those."""
    dims = dims_of(cfg, batch, seq)
    largest = max(v for d, v in dims.items() if d != "head")
    heads = head_splits(cfg) if split_heads else []
    out, seen = [], set()
    size = smallest
    while True:
        for t in (Tiling.uniform(size), Tiling({d: size for d in ("embd", "inner", "vocab")})):
            variants = [t]
            if t.tile("head", cfg.n_head) == cfg.n_head and 2 * t.tile("seq", seq) >= seq:
                variants = [Tiling({**t.sizes, "head": h}) for h in heads] + variants
            for v in variants:
                key = effective(v, dims)
                if key not in seen:
                    seen.add(key)
                    out.append(v)
        if size >= largest:
            break
        size *= 2
    return out


def worker_counts(max_workers: int) -> list[int]:
    return list(range(1, max_workers + 1))


def short_label(tiling: Tiling) -> str:
    """``64`` for a uniform tiling; ``512,head=2`` where every dimension is named and most share one size (the
    form ``--tile`` reads back); else the named sizes (``embd=64,inner=64,vocab=64``)."""
    sizes = tiling.sizes
    if len(sizes) == len(DIMS):
        common, count = Counter(sizes.values()).most_common(1)[0]
        if count == len(DIMS):
            return str(common)
        if 2 * count > len(DIMS):
            return ",".join([str(common)] + [f"{d}={sizes[d]}" for d in DIMS if sizes[d] != common])
    return tiling.describe()
