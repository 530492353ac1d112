"""Owner ranks of a graph's tiles: how a step's data are spread over several processes.

Every tile gets one owner rank, as StarPU-MPI requires of registered data
(``starpu_mpi_data_register(handle, tag, rank)``); where tasks then run follows
from the owners by StarPU-MPI's insert-task rule (:mod:`tilecast.graph.owner_computes`).
Three named distributions:

- ``data``: tiles of tensors with a batch dimension (inputs, activations) go
  to ranks by batch tile, in contiguous blocks; the graph is first rewritten so
  that every rank accumulates its own partial gradients, which the owner of
  each gradient tile sums (:func:`prepare`,
  :mod:`tilecast.graph.partial_gradients`); parameter tiles are sharded
  over the ranks one by one (tiles that one task writes together, as a
  LayerNorm's gain and bias gradients, as one), each to the rank holding the
  fewest parameter bytes so far, and a parameter tile's gradient and AdamW moments live with
  it (as ZeRO-3/FSDP shard them). Other tiles (the loss) live on rank 0.
- ``layer``: a contiguous block of layers per rank (a pipeline). A tensor
  goes with the layer of its name (``h.L.``; residual ``x.L`` with layer
  L-1); other tensors with the stage of the first task that touches them:
  the embeddings' on rank 0, the head's and the loss's (and the residual
  gradient ``dx``, which every layer's backward updates in place) on the last.
  Gradients and moments live with their parameter.
- ``cyclic``: 2-D block-cyclic over each tensor's tile grid on a P x Q grid of
  ranks (P * Q = ranks, P <= Q, P as large as possible), as ScaLAPACK lays out
  matrices: the grid is seen as a matrix whose columns are the last tiled axis
  and rows everything before it; tile (i, j) goes to rank (i mod P) * Q + (j mod Q).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from tilecast.graph.graph import Graph
from tilecast.graph.partial_gradients import partial_rank, with_partial_gradients
from tilecast.kernels.registry import W
from tilecast.errors import FieldError

DISTRIBUTIONS = {
    "data": "batch tiles spread over ranks, each rank's partial gradients summed on their owner; parameters, "
            "gradients and AdamW moments sharded by tile (ZeRO-3)",
    "layer": "a contiguous block of layers per rank (pipeline)",
    "cyclic": "2-D block-cyclic over every tensor's tile grid (tensor parallelism)",
}

# Gradient and AdamW-moment tensors are named after their parameter (tilecast.graph.gpt2.grad_name/adam_names).
_STATE_PREFIX = re.compile(r"^(?:grad|adam_m|adam_v):")
_LAYER = re.compile(r"^h\.(\d+)\.")
_RESIDUAL = re.compile(r"^x\.(\d+)$")
_TAG_LAYER = re.compile(r"^h(\d+)\.")


@dataclass
class Distribution:
    """``owner[tile]``: the rank that owns each tile of ``graph`` under distribution ``name``."""

    name: str
    ranks: int
    owner: np.ndarray  # int32 per tile
    grid: tuple[int, int] | None = None  # the P x Q rank grid of ``cyclic``

    def describe(self) -> str:
        grid = f" ({self.grid[0]} x {self.grid[1]} rank grid)" if self.grid else ""
        return f"{self.name} over {self.ranks} ranks{grid}"


def param_of(name: str) -> str:
    """The parameter a gradient or AdamW-moment tensor belongs to (the name itself otherwise)."""
    return _STATE_PREFIX.sub("", name)


def rank_grid(ranks: int) -> tuple[int, int]:
    """P x Q = ranks with P <= Q and P as large as possible."""
    p = max(d for d in range(1, math.isqrt(ranks) + 1) if ranks % d == 0)
    return p, ranks // p


def _blocks(n_items: int, ranks: int) -> np.ndarray:
    """Rank of each of n_items in contiguous, balanced blocks."""
    return (np.arange(n_items, dtype=np.int64) * ranks // n_items).astype(np.int32)


def _data(graph: Graph, ranks: int) -> np.ndarray:
    owner = np.zeros(graph.n_tiles, dtype=np.int32)
    batched = [t for t in graph.tensors if "batch" in t.dims]
    n_batch_tiles = {t.grid[t.dims.index("batch")] for t in batched}
    nb = min(n_batch_tiles) if n_batch_tiles else 0
    if nb < ranks:
        raise FieldError(f"ranks: the data distribution needs a batch tile per rank; this step has {nb} batch "
                         f"tile(s) for {ranks} ranks (use a larger batch or a smaller batch tile)")
    for t in graph.tensors:
        r = partial_rank(t.name)
        if r is not None:
            owner[t.first_tile:t.first_tile + t.n_tiles] = r
    for t in batched:
        axis = t.dims.index("batch")
        coords = np.unravel_index(np.arange(t.n_tiles), t.grid)[axis]
        owner[t.first_tile:t.first_tile + t.n_tiles] = _blocks(t.grid[axis], ranks)[coords]
    load = np.zeros(ranks, dtype=np.int64)
    for group in _parameter_groups(graph):
        r = int(np.argmin(load))
        owner[group] = r
        load[r] += int(graph.tile_nbytes[group].sum())
    _with_parameters(graph, owner)
    return owner


def _parameter_tile_of(graph: Graph) -> np.ndarray:
    """Per tile: the parameter tile it belongs to (itself for a parameter, its parameter's for a gradient or
    moment), -1 for other tiles."""
    out = np.full(graph.n_tiles, -1, dtype=np.int64)
    for t in graph.tensors:
        if t.kind in ("param", "grad", "optim"):
            p = graph.tensor(param_of(t.name))
            out[t.first_tile:t.first_tile + t.n_tiles] = np.arange(p.first_tile, p.first_tile + p.n_tiles)
    return out


def _parameter_groups(graph: Graph) -> list[np.ndarray]:
    """Parameter tiles in groups that one task writes together (e.g. a LayerNorm's gain and bias gradient
    tiles), so that a shard never splits a task's written tiles over ranks; groups in tile order."""
    ptile = _parameter_tile_of(graph)
    written = (graph.acc_mode & W) != 0
    acc_p = ptile[graph.acc_tile]
    sel = np.flatnonzero(written & (acc_p >= 0))
    parent = {}

    def find(a):
        while parent.get(a, a) != a:
            parent[a] = parent.get(parent[a], parent[a])
            a = parent[a]
        return a

    task, tiles = graph.access_task[sel], acc_p[sel]
    first = np.r_[True, task[1:] != task[:-1]]
    anchor = tiles[np.maximum.accumulate(np.where(first, np.arange(len(sel)), 0))]
    for a, b in zip(anchor[~first].tolist(), tiles[~first].tolist()):
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    params = np.flatnonzero(np.arange(graph.n_tiles) == ptile)
    roots = np.array([find(int(t)) for t in params.tolist()], dtype=np.int64)
    order = np.argsort(roots, kind="stable")
    cuts = np.flatnonzero(np.diff(roots[order])) + 1
    groups = np.split(params[order], cuts)
    return sorted(groups, key=lambda g: int(g[0]))


def _with_parameters(graph: Graph, owner: np.ndarray) -> None:
    """Gradients and AdamW moments take their parameter's owners, tile by tile (same grid)."""
    for t in graph.tensors:
        if t.kind in ("grad", "optim"):
            p = graph.tensor(param_of(t.name))
            owner[t.first_tile:t.first_tile + t.n_tiles] = owner[p.first_tile:p.first_tile + p.n_tiles]


def _first_tags(graph: Graph) -> np.ndarray:
    """Per tensor, the tag id of the first task that touches it (-1 if none)."""
    first = np.full(len(graph.tensors), -1, dtype=np.int64)
    tensor_of_access = graph.tile_tensor[graph.acc_tile]
    seen, idx = np.unique(tensor_of_access, return_index=True)  # accesses are in task order
    first[seen] = graph.tag[graph.access_task[idx]]
    return first


def _layer(graph: Graph, ranks: int) -> np.ndarray:
    n_layer = int(graph.meta.get("model", {}).get("n_layer", 0))
    if n_layer < ranks:
        raise FieldError(f"ranks: the layer distribution needs a layer per rank; the model has {n_layer} "
                         f"layer(s) for {ranks} ranks")
    stage_of_layer = _blocks(n_layer, ranks)
    first_tag = _first_tags(graph)

    def rank_of_tag(tag_id: int) -> int:
        tag = graph.tags[tag_id] if tag_id >= 0 else ""
        m = _TAG_LAYER.match(tag)
        if m:
            return int(stage_of_layer[int(m.group(1))])
        return 0 if tag.startswith("embed") else ranks - 1

    owner = np.zeros(graph.n_tiles, dtype=np.int32)
    for t in graph.tensors:
        name = param_of(t.name)
        m, x = _LAYER.match(name), _RESIDUAL.match(name)
        if m:
            r = int(stage_of_layer[int(m.group(1))])
        elif x:
            k = int(x.group(1))
            r = int(stage_of_layer[k - 1]) if k else 0
        else:
            r = rank_of_tag(int(first_tag[graph.tensor(name).id]))
        owner[t.first_tile:t.first_tile + t.n_tiles] = r
    return owner


def _cyclic(graph: Graph, ranks: int) -> tuple[np.ndarray, tuple[int, int]]:
    p, q = rank_grid(ranks)
    owner = np.zeros(graph.n_tiles, dtype=np.int32)
    for t in graph.tensors:
        tiled = [a for a, g in enumerate(t.grid) if g > 1]
        if not tiled:
            continue  # one tile: rank 0, as every matrix's first block
        col_axis = tiled[-1]
        coords = np.unravel_index(np.arange(t.n_tiles), t.grid)
        col = coords[col_axis]
        rest = [g for a, g in enumerate(t.grid) if a != col_axis]
        row = np.ravel_multi_index([c for a, c in enumerate(coords) if a != col_axis], rest) if rest else 0 * col
        owner[t.first_tile:t.first_tile + t.n_tiles] = (row % p) * q + col % q
    return owner, (p, q)


def distribute(graph: Graph, ranks: int, name: str) -> Distribution:
    """The owner rank of every tile of ``graph`` under distribution ``name`` over ``ranks`` ranks.

    FieldError (naming ``ranks`` or ``distribution``) when the distribution is
    unknown or cannot use that many ranks.
    """
    if name not in DISTRIBUTIONS:
        raise FieldError(f"distribution: unknown distribution {name!r}; choose from {', '.join(DISTRIBUTIONS)}")
    if isinstance(ranks, bool) or not isinstance(ranks, (int, np.integer)) or ranks < 1:
        raise FieldError(f"ranks must be a positive integer, got {ranks!r}")
    ranks = int(ranks)
    if name == "data":
        return Distribution(name, ranks, _data(graph, ranks))
    if name == "layer":
        return Distribution(name, ranks, _layer(graph, ranks))
    owner, grid = _cyclic(graph, ranks)
    return Distribution(name, ranks, owner, grid)


def prepare(graph: Graph, ranks: int, name: str) -> tuple[Graph, Distribution]:
    """The graph that runs under distribution ``name`` over ``ranks`` ranks, and its tiles' owners.

    ``data`` splits each gradient's accumulation into per-rank partial sums reduced on the gradient's owner
    (:func:`tilecast.graph.partial_gradients.with_partial_gradients`); the others run ``graph`` as it is.
    FieldError as :func:`distribute`.
    """
    dist = distribute(graph, ranks, name)
    if name != "data" or dist.ranks < 2:
        return graph, dist
    run = with_partial_gradients(graph, dist.ranks)
    return run, distribute(run, dist.ranks, name)
