"""Where each task runs and which tiles travel between ranks, by StarPU-MPI's insert-task rule.

Every rank submits every task with ``starpu_mpi_task_insert``; StarPU-MPI
1.3.10 decides (``mpi/src/starpu_mpi_task_insert.c``):

- **Executing rank** (``_starpu_mpi_find_executee_node``): the owner of the
  task's written buffers (mode W or RW). When written buffers have different
  owners, or the task writes nothing, the node-selection policy chooses
  (``_starpu_mpi_task_decode_v`` then ``_starpu_mpi_select_node``); the
  default, ``_starpu_mpi_select_node_with_most_data``
  (``mpi/src/starpu_mpi_select_node.c``), sums per rank the sizes of the
  buffers it owns, once for reading and once more for writing, and picks the
  largest (the lowest rank on ties, rank 0 if every sum is 0).
- **Before execution** (``_starpu_mpi_exchange_data_before_execution``): a
  buffer read (R or RW) that the executing rank does not own is sent by its
  owner, unless the executing rank already holds it from an earlier receive
  (``starpu_mpi_cached_receive_set`` / ``starpu_mpi_cached_send_set``).
- **After execution** (``_starpu_mpi_exchange_data_after_execution``): a
  written buffer that the executing rank does not own is sent back to its
  owner, every time (no cache).
- **Cache** (``_starpu_mpi_clear_data_after_execution``): a written buffer is
  dropped from every rank's cache, so the next read elsewhere receives it again.

The cache is modelled empty at the start of the step: between steps the
executor flushes it (the batch is rewritten in place), and every tile read
in a step is written in it before, except the inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tilecast.graph.graph import Graph
from tilecast.kernels.registry import R, W


@dataclass
class Transfers:
    """Tiles sent between ranks in one step, one row per message, in submission order of their cause."""

    task: np.ndarray  # the task whose submission causes the message
    tile: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    back: np.ndarray  # bool: a written tile sent back to its owner (after execution)

    def __len__(self) -> int:
        return len(self.task)


@dataclass
class RankPlan:
    """What every rank does in one step under a distribution."""

    ranks: int
    task_rank: np.ndarray  # int32 per task: the rank that executes it
    transfers: Transfers
    inconsistent: int  # tasks whose written tiles have several owners (placed by the most-data policy)

    def per_rank(self, graph: Graph) -> list[dict]:
        """Per rank: tasks, flops, tiles owned and their bytes, bytes and messages sent and received."""
        n = self.ranks
        tasks = np.bincount(self.task_rank, minlength=n)
        flops = np.bincount(self.task_rank, weights=graph.flops, minlength=n)
        t = self.transfers
        sent = np.bincount(t.src, weights=t.nbytes, minlength=n)
        recv = np.bincount(t.dst, weights=t.nbytes, minlength=n)
        msg_out = np.bincount(t.src, minlength=n)
        msg_in = np.bincount(t.dst, minlength=n)
        return [dict(rank=r, tasks=int(tasks[r]), flops=float(flops[r]), bytes_sent=int(sent[r]),
                     bytes_received=int(recv[r]), messages_sent=int(msg_out[r]), messages_received=int(msg_in[r]))
                for r in range(n)]

    def matrix(self) -> np.ndarray:
        """(ranks, ranks) bytes sent from row rank to column rank."""
        m = np.zeros((self.ranks, self.ranks), dtype=np.int64)
        np.add.at(m, (self.transfers.src, self.transfers.dst), self.transfers.nbytes)
        return m


def _most_data(owners: np.ndarray, sizes: np.ndarray, modes: np.ndarray, ranks: int) -> int:
    """StarPU-MPI's default node selection (_starpu_mpi_select_node_with_most_data)."""
    score = np.zeros(ranks, dtype=np.int64)
    np.add.at(score, owners, sizes * ((modes & R) != 0))
    np.add.at(score, owners, sizes * ((modes & W) != 0))
    return int(np.argmax(score)) if score.max() > 0 else 0


def task_ranks(graph: Graph, owner: np.ndarray, ranks: int) -> tuple[np.ndarray, int]:
    """(executing rank of every task, number of tasks placed by the most-data policy)."""
    acc_owner = owner[graph.acc_tile].astype(np.int64)
    written = (graph.acc_mode & W) != 0
    task_of = graph.access_task
    n = graph.n_tasks
    # Owner of the first written buffer of each task (-1: none written).
    first_w = np.full(n, -1, dtype=np.int64)
    w_idx = np.flatnonzero(written)
    tasks_w, first = np.unique(task_of[w_idx], return_index=True)
    first_w[tasks_w] = acc_owner[w_idx[first]]
    # Tasks whose written buffers disagree on the owner.
    differs = np.zeros(n, dtype=bool)
    mismatch = w_idx[acc_owner[w_idx] != first_w[task_of[w_idx]]]
    differs[task_of[mismatch]] = True
    rank = first_w.copy()
    odd = np.flatnonzero(differs | (first_w < 0))
    for i in odd.tolist():
        a, b = graph.acc_ptr[i], graph.acc_ptr[i + 1]
        rank[i] = _most_data(acc_owner[a:b], graph.tile_nbytes[graph.acc_tile[a:b]], graph.acc_mode[a:b], ranks)
    return rank.astype(np.int32), int(differs.sum())


def access_epochs(graph: Graph) -> np.ndarray:
    """Per access, the write epoch of its tile: how many writes the tile had in earlier tasks (the read part
    of an RW access sees the tile before its own write, as the exchange precedes the cache clearing)."""
    tile = graph.acc_tile.astype(np.int64)
    order = np.lexsort((np.arange(len(tile)), tile))  # by tile, then access (= task) order
    w = ((graph.acc_mode[order] & W) != 0).astype(np.int64)
    t_sorted = tile[order]
    start = np.r_[True, t_sorted[1:] != t_sorted[:-1]]
    csum = np.cumsum(w)
    group_base = np.maximum.accumulate(np.where(start, csum - w, 0))
    epoch = np.empty(len(tile), dtype=np.int64)
    epoch[order] = csum - w - group_base
    return epoch


def plan(graph: Graph, owner: np.ndarray, ranks: int) -> RankPlan:
    """Executing ranks and the step's messages (sizes, ends) under the insert-task rule and its cache."""
    owner = np.asarray(owner)
    if len(owner) != graph.n_tiles:
        raise ValueError(f"owner has {len(owner)} entries, the graph has {graph.n_tiles} tiles")
    task_rank, inconsistent = task_ranks(graph, owner, ranks)
    tile = graph.acc_tile.astype(np.int64)
    mode = graph.acc_mode
    task_of = graph.access_task
    xrank = task_rank[task_of].astype(np.int64)
    acc_owner = owner[tile].astype(np.int64)
    epoch = access_epochs(graph)
    # Reads by a non-owner: one message per (tile, epoch, executing rank), at its first such read.
    remote = np.flatnonzero(((mode & R) != 0) & (xrank != acc_owner))
    key = np.stack([tile[remote], epoch[remote], xrank[remote]], axis=1)
    _, first = np.unique(key, axis=0, return_index=True) if len(remote) else (None, np.zeros(0, np.int64))
    fetch = remote[np.sort(first)]
    # Written tiles not owned by the executing rank: sent back to the owner after every such task.
    back = np.flatnonzero(((mode & W) != 0) & (xrank != acc_owner))
    idx = np.concatenate([fetch, back])
    is_back = np.r_[np.zeros(len(fetch), bool), np.ones(len(back), bool)]
    src = np.where(is_back, xrank[idx], acc_owner[idx])
    dst = np.where(is_back, acc_owner[idx], xrank[idx])
    o = np.lexsort((is_back, task_of[idx]))
    idx, is_back, src, dst = idx[o], is_back[o], src[o], dst[o]
    transfers = Transfers(task=task_of[idx], tile=tile[idx], src=src.astype(np.int32), dst=dst.astype(np.int32),
                          nbytes=graph.tile_nbytes[tile[idx]].astype(np.int64), back=is_back)
    return RankPlan(ranks=ranks, task_rank=task_rank, transfers=transfers, inconsistent=inconsistent)


def rank_figures(graph: Graph, distribution) -> dict:
    """The per-step figures of ``graph`` under ``distribution`` (a :class:`~tilecast.graph.distribution.Distribution`),
    as ``tilecast graph --ranks`` prints them (keys and units in docs/mpi.md)."""
    p = plan(graph, distribution.owner, distribution.ranks)
    owned = np.bincount(distribution.owner, weights=graph.tile_nbytes, minlength=distribution.ranks)
    rows = p.per_rank(graph)
    for r in rows:
        r["owned_bytes"] = int(owned[r["rank"]])
    t = p.transfers
    return {
        "distribution": distribution.name, "ranks": distribution.ranks,
        "rank_grid": list(distribution.grid) if distribution.grid else None,
        "tasks": graph.n_tasks, "bytes_moved": int(t.nbytes.sum()), "messages": len(t),
        "bytes_sent_back": int(t.nbytes[t.back].sum()), "tasks_placed_by_most_data": p.inconsistent,
        "per_rank": rows, "bytes_matrix": p.matrix().tolist(),
    }
