"""Data parallelism's gradient reduction, written into a graph: per-rank partial gradients summed on the owner.

In a built step each gradient tile accumulates its contributions from every
batch tile in one chain of tasks. Under owner-computes (StarPU-MPI) that chain
runs on the gradient tile's owner, which would then receive every batch
tile's activations. :func:`with_partial_gradients` rewrites the graph so that
each task of such a chain (a task with a ``beta`` parameter that writes a
gradient tile and reads a batch-distributed tile) accumulates into a partial
gradient tile of the rank that owns its batch tile, tensor
``partial<R>:grad:<param>`` (first contribution overwrites, later ones add);
after the last of them and before anything else reads the gradient, the
gradient tile becomes the sum of its partials in rank order (``fill`` with 0
if no other task wrote it before, then one ``axpy`` per partial), on the
gradient's owner: each rank sends one partial tile per gradient tile, as
ZeRO-3/FSDP reduce-scatter their gradients.
"""

from __future__ import annotations

import re

import numpy as np

from tilecast.graph.graph import Graph
from tilecast.graph.tensor import Tensor
from tilecast.kernels import all_kernels, get
from tilecast.kernels.registry import R, RW, W

PARTIAL = re.compile(r"^partial(\d+):")


def partial_name(rank: int, grad: str) -> str:
    return f"partial{rank}:{grad}"


def partial_rank(name: str) -> int | None:
    """The rank a partial-gradient tensor belongs to, None for other tensors."""
    m = PARTIAL.match(name)
    return int(m.group(1)) if m else None


def _batch_rank(graph: Graph, ranks: int) -> np.ndarray:
    """Per tile: the rank of its batch tile for tensors with a batch dimension (contiguous blocks), else -1."""
    out = np.full(graph.n_tiles, -1, dtype=np.int64)
    for t in graph.tensors:
        if "batch" in t.dims:
            axis = t.dims.index("batch")
            nb = t.grid[axis]
            coords = np.unravel_index(np.arange(t.n_tiles), t.grid)[axis]
            out[t.first_tile:t.first_tile + t.n_tiles] = coords * ranks // nb
    return out


def with_partial_gradients(graph: Graph, ranks: int) -> Graph:
    """``graph`` with each gradient accumulated per rank and reduced on its owner (see the module's doc).

    With one rank, or no gradient chain to split, the graph is returned unchanged.
    """
    kernels = all_kernels()
    has_beta = np.array(["beta" in k.params for k in kernels])
    beta_pos = np.array([k.params.index("beta") if "beta" in k.params else -1 for k in kernels])
    kinds = np.array([t.kind for t in graph.tensors])
    tile_is_grad = kinds[graph.tile_tensor] == "grad"
    task_of = graph.access_task
    written = (graph.acc_mode & W) != 0
    reads = (graph.acc_mode & R) != 0
    brank = _batch_rank(graph, ranks)
    # A task's batch rank: the rank of the first batch tile it reads.
    rb = np.flatnonzero(reads & (brank[graph.acc_tile] >= 0))
    task_rank = np.full(graph.n_tasks, -1, dtype=np.int64)
    tasks_r, first = np.unique(task_of[rb], return_index=True)
    task_rank[tasks_r] = brank[graph.acc_tile[rb[first]]]
    gw = written & tile_is_grad[graph.acc_tile]
    redirect_task = np.zeros(graph.n_tasks, dtype=bool)
    redirect_task[task_of[gw]] = True
    redirect_task &= has_beta[graph.kernel] & (task_rank >= 0)
    if ranks < 2 or not redirect_task.any():
        return graph
    red_acc = np.flatnonzero(gw & redirect_task[task_of])  # accesses moved to a partial tile

    # Partial tensors: one per (gradient tensor, rank) that receives contributions.
    acc_tensor = graph.tile_tensor[graph.acc_tile[red_acc]].astype(np.int64)
    acc_rank = task_rank[task_of[red_acc]]
    pairs = sorted(set(zip(acc_tensor.tolist(), acc_rank.tolist())))
    tensors = list(graph.tensors)
    base = {}
    n_tiles = graph.n_tiles
    for tid, r in pairs:
        g = graph.tensors[tid]
        t = Tensor(partial_name(r, g.name), g.shape, g.dims, g.tile, g.dtype, "activation", n_tiles, len(tensors))
        tensors.append(t)
        base[(tid, r)] = n_tiles
        n_tiles += t.n_tiles
    acc_tile = graph.acc_tile.astype(np.int64).copy()
    local = acc_tile[red_acc] - np.array([graph.tensors[t].first_tile for t in acc_tensor.tolist()])
    acc_tile[red_acc] = np.array([base[p] for p in zip(acc_tensor.tolist(), acc_rank.tolist())]) + local
    # Beta and modes of the partial chains: the first contribution to a partial tile overwrites.
    acc_mode = graph.acc_mode.copy()
    params = graph.params.copy()
    _, first_idx = np.unique(acc_tile[red_acc], return_index=True)
    is_first = np.zeros(len(red_acc), dtype=bool)
    is_first[first_idx] = True
    acc_mode[red_acc] = np.where(is_first, W, RW)
    red_tasks = task_of[red_acc]
    params[graph.param_ptr[red_tasks] + beta_pos[graph.kernel[red_tasks]]] = np.where(is_first, 0.0, 1.0)

    # Where each gradient tensor is reduced: before the first other access to it after its first partial write.
    inserts = {}  # task index -> list of (kernel, tag, params, tiles, modes)
    red_of_tensor = {}
    for tid in sorted({p[0] for p in pairs}):
        red_of_tensor[tid] = red_tasks[acc_tensor == tid]
    direct = np.flatnonzero(~np.isin(np.arange(len(acc_tile)), red_acc))
    direct_tensor = graph.tile_tensor[graph.acc_tile[direct]]
    dw = direct[written[direct]]
    first_direct_write = np.full(graph.n_tiles, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_direct_write, graph.acc_tile[dw], task_of[dw])
    fill, axpy = get("fill"), get("axpy")
    partial_tiles = set(acc_tile[red_acc].tolist())
    for tid, tasks in red_of_tensor.items():
        g = graph.tensors[tid]
        lo, hi = int(tasks.min()), int(tasks.max())
        other = task_of[direct[direct_tensor == tid]]
        after = other[other > lo]
        at = int(after.min()) if len(after) else graph.n_tasks
        if at < hi:
            raise ValueError(f"{g.name}: another task touches the gradient between its accumulations; "
                             f"cannot split it into partial sums")
        tag = int(graph.tag[min(at, graph.n_tasks - 1)])
        ranks_of = sorted(r for t, r in pairs if t == tid)
        sizes = np.prod(g.tile_shapes(), axis=1)
        ops = inserts.setdefault(at, [])
        for i in range(g.n_tiles):
            tile = g.first_tile + i
            parts = [base[(tid, r)] + i for r in ranks_of if base[(tid, r)] + i in partial_tiles]
            if not parts:
                continue
            if first_direct_write[tile] > at:  # nothing else wrote it before: start from zero
                ops.append((fill.id, tag, [float(sizes[i]), 0.0], [tile], [W]))
            for p in parts:
                ops.append((axpy.id, tag, [float(sizes[i]), 1.0], [p, tile], [R, RW]))
    return _assemble(graph, tensors, n_tiles, acc_tile, acc_mode, params, inserts)


def _assemble(graph, tensors, n_tiles, acc_tile, acc_mode, params, inserts) -> Graph:
    """The graph's tasks with ``inserts[i]`` placed before task i (at the end for i = n_tasks)."""
    n = graph.n_tasks
    ins_pos, ins_k, ins_tag, ins_p, ins_t, ins_m = [], [], [], [], [], []
    for pos in sorted(inserts):
        for k, tag, p, t, m in inserts[pos]:
            ins_pos.append(pos)
            ins_k.append(k)
            ins_tag.append(tag)
            ins_p.append(p)
            ins_t.append(t)
            ins_m.append(m)
    m_ins = len(ins_pos)
    # Order of units: original task i at (i, 1), inserted ones at (pos, 0, j).
    key_pos = np.r_[np.arange(n), np.array(ins_pos, dtype=np.int64)]
    key_kind = np.r_[np.ones(n, np.int64), np.zeros(m_ins, np.int64)]
    order = np.lexsort((np.arange(n + m_ins), key_kind, key_pos))
    p_len = np.r_[np.diff(graph.param_ptr), [len(p) for p in ins_p]].astype(np.int64)
    a_len = np.r_[np.diff(graph.acc_ptr), [len(t) for t in ins_t]].astype(np.int64)
    p_start = np.r_[graph.param_ptr[:-1], len(params) + np.r_[0, np.cumsum(p_len[n:])[:-1]]].astype(np.int64)
    a_start = np.r_[graph.acc_ptr[:-1], len(acc_tile) + np.r_[0, np.cumsum(a_len[n:])[:-1]]].astype(np.int64)
    pool_p = np.r_[params, np.concatenate(ins_p) if ins_p else np.zeros(0)]
    pool_t = np.r_[acc_tile, np.concatenate(ins_t) if ins_t else np.zeros(0, np.int64)]
    pool_m = np.r_[acc_mode, np.concatenate(ins_m) if ins_m else np.zeros(0, np.int8)].astype(np.int8)

    def gather(start, length):
        length = length[order]
        ptr = np.r_[0, np.cumsum(length)].astype(np.int64)
        idx = np.repeat(start[order] - ptr[:-1], length) + np.arange(ptr[-1])
        return ptr, idx

    param_ptr, pidx = gather(p_start, p_len)
    acc_ptr, aidx = gather(a_start, a_len)
    kernel = np.r_[graph.kernel, np.array(ins_k, dtype=np.int16)].astype(np.int16)[order]
    tag = np.r_[graph.tag, np.array(ins_tag, dtype=graph.tag.dtype)].astype(graph.tag.dtype)[order]
    tile_tensor = np.concatenate([np.full(t.n_tiles, t.id, dtype=np.int32) for t in tensors])
    tile_nbytes = np.concatenate([np.prod(t.tile_shapes(), axis=1) * t.dtype.itemsize for t in tensors]).astype(np.int64)
    assert len(tile_tensor) == n_tiles
    meta = dict(graph.meta, partial_gradients=True)
    return Graph(tensors=tensors, tile_tensor=tile_tensor, tile_nbytes=tile_nbytes, kernel=kernel, tag=tag,
                 tags=list(graph.tags), param_ptr=param_ptr, params=pool_p[pidx], acc_ptr=acc_ptr,
                 acc_tile=pool_t[aidx].astype(graph.acc_tile.dtype), acc_mode=pool_m[aidx], meta=meta)
