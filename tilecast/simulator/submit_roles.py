"""What a rank's main thread spends on each task it submits, by its role in the task.

Every rank's main thread calls ``starpu_mpi_task_insert`` for every task of the step, but the call does not
cost the same everywhere (StarPU-MPI 1.3.10, ``mpi/src/starpu_mpi_task_insert.c``):

- on the rank that runs the task (``exec``) it decodes the buffers and creates and submits a StarPU task
  (``_starpu_task_insert_create``, ``starpu_task_submit``: implicit dependencies per buffer, the push to the
  scheduler);
- on every other rank (``other``) it only decodes the buffers and checks StarPU-MPI's cache
  (``_starpu_mpi_task_decode_v``, ``_starpu_mpi_exchange_data_before_execution``);
- each message the rank posts for the task costs more: a send (``send``, ``starpu_mpi_isend_detached``) or a
  receive (``recv``, ``starpu_mpi_irecv_detached``) builds a request and acquires the tile through
  ``starpu_data_acquire_on_node_cb_sequential_consistency_sync_jobids``
  (``src/datawizard/user_interactions.c``), which creates two internal tasks and submits one with the tile's
  implicit dependencies;
- a task run elsewhere that writes a tile the rank holds a received copy of (``drop``) makes it drop that copy
  from StarPU-MPI's cache (``_starpu_mpi_clear_data_after_execution``, ``mpi/src/starpu_mpi_task_insert.c``;
  ``_starpu_mpi_cache_received_data_clear``, ``mpi/src/starpu_mpi_cache.c``), which submits the copy's
  invalidation (``starpu_data_invalidate_submit``) behind every task of the rank that read it: counted as
  those readers, the dependencies the invalidation is given. Parameters fetched by every rank in a ``data``
  step and updated by their owner's AdamW are such tiles: measured on the 2-core Intel Xeon, an ``adamw`` run
  elsewhere cost 6.6-6.9 us to insert in a ``data`` step of tile 32 (some 7 readers per copy), 0.9-1.1 us in the
  probe's ``layer`` step; fitted per dependency, 0.6-1.0 us in both and in a ``data`` step of tile 64;
- each implicit dependency StarPU gives a task the rank runs (``deps``, :func:`implicit_deps`;
  ``_starpu_detect_implicit_data_deps_with_handle``, ``src/core/dependencies/implicit_data_deps.c``) costs
  its insertion more: a task that writes a tile read by many tasks since its last write depends on each of
  them. Measured on the 2-core Intel Xeon, an ``adamw`` of the probe (some 17-24 dependencies, its parameter
  read by every GEMM of the layer) took 10-20 us to insert where a GEMM (2-3) took 1.1-1.3; fitted on the
  probe alone, 0.5 us a dependency and 0.1 us a task otherwise, which put each rank's submission CPU of steps
  of tiles 32 to 128 within -19% to +8% of measured (mean 6.9% off), against -17% to +18% (13.7%) with one
  cost per task run.

The costs per role are fitted on a probe step's per-task insertion times (:func:`fit_roles`,
:mod:`tilecast.loop.ranks_probe`); :func:`task_seconds` gives each rank's cost of each task of another step
from its plan (:func:`tilecast.graph.owner_computes.plan`). On the 2-core AMD EPYC (load 8) a task the rank
runs took 1.0-1.3 us, one it does not 0.15-0.25 us, and each send or receive it posts some 2-5 us more, so
the same count of tasks costs a ``data`` step (one message per 15 tasks) more than a ``layer`` one (one per 30).
"""

from __future__ import annotations

import numpy as np

ROLES = ("exec", "other", "send", "recv", "drop", "deps")
PREEMPTED_S = 100e-6  # an insertion longer than this lost its core meanwhile: left out of the fit


def role_counts(task_rank: np.ndarray, transfers, ranks: int, graph=None) -> np.ndarray:
    """(ranks, tasks, 6): per rank and task, the counts of :data:`ROLES`: whether the rank runs the task, whether
    it does not, the messages of the task it sends and those it receives (``transfers``: the plan's, each
    posted by its sender's and its receiver's main thread while they insert the task that causes it), the
    dependencies of the received copies it drops for the task (:func:`drop_counts`) and the implicit
    dependencies of the task where the rank runs it (:func:`implicit_deps`); the last two zero without
    ``graph``."""
    task_rank = np.asarray(task_rank)
    n = len(task_rank)
    out = np.zeros((ranks, n, len(ROLES)))
    for r in range(ranks):
        runs = task_rank == r
        out[r, :, 0] = runs
        out[r, :, 1] = ~runs
        out[r, :, 2] = np.bincount(transfers.task[transfers.src == r], minlength=n)[:n]
        out[r, :, 3] = np.bincount(transfers.task[transfers.dst == r], minlength=n)[:n]
        if graph is not None:
            out[r, :, 4] = drop_counts(graph, task_rank, transfers, r)
            out[r, :, 5] = implicit_deps(graph, task_rank, transfers, r)
    return out


def implicit_deps(graph, task_rank: np.ndarray, transfers, rank: int) -> np.ndarray:
    """Per task ``rank`` runs: the implicit dependencies StarPU gives it when it is submitted (zero for the
    others). A tile's accesses on ``rank`` in submission order are its tasks' own and those of the messages the
    rank posts (a send reads the tile, a receive writes it; a message is posted while its cause is inserted,
    before it, or after it where a written tile goes back to its owner). A read depends on the tile's last
    write; a write on the reads since the last write, or on that write where there were none. A task that has
    ended is no longer a tile's last writer or reader (``_starpu_release_data_enforce_sequential_consistency``),
    so a step's first access to a tile depends on nothing, and the step's tasks are counted as not ended while
    it is submitted (its worker runs little before its main thread is done: ``simulator/ranks_submission.py``)."""
    from tilecast.kernels.registry import W

    task_rank = np.asarray(task_rank)
    n = len(task_rank)
    at = np.asarray(graph.access_task, dtype=np.int64)
    here = task_rank[at] == rank
    src, dst = np.asarray(transfers.src) == rank, np.asarray(transfers.dst) == rank
    m_task = np.asarray(transfers.task, dtype=np.int64)
    m_back = np.asarray(transfers.back, dtype=bool)
    m_tile = np.asarray(transfers.tile, dtype=np.int64)
    task = np.concatenate([at[here], m_task[src], m_task[dst]])
    tile = np.concatenate([np.asarray(graph.acc_tile, dtype=np.int64)[here], m_tile[src], m_tile[dst]])
    write = np.concatenate([(np.asarray(graph.acc_mode)[here] & W) != 0, np.zeros(src.sum(), bool),
                            np.ones(dst.sum(), bool)])
    if not len(task):
        return np.zeros(n)
    own = np.arange(len(task)) < here.sum()
    # position in submission order: a message before its cause's own accesses, or after them if it goes back
    back = np.concatenate([np.zeros(here.sum(), bool), m_back[src], m_back[dst]])
    pos = 3 * task + np.where(own, 1, np.where(back, 2, 0))
    order = np.lexsort((np.arange(len(task)), pos, tile))
    tile, write, task, own = tile[order], write[order], task[order], own[order]
    idx = np.arange(len(tile))
    group = np.maximum.accumulate(np.where(np.r_[True, tile[1:] != tile[:-1]], idx, 0))  # its tile's first
    prev_w = np.r_[-1, np.maximum.accumulate(np.where(write, idx, -1))[:-1]]
    prev_w = np.where(prev_w >= group, prev_w, -1)  # the last write before, in the same tile
    has_w = (prev_w >= 0).astype(np.int64)
    reads = idx - np.where(has_w > 0, prev_w + 1, group)  # every access between it and that write is a read
    deps = np.where(write, np.where(reads > 0, reads, has_w), has_w)
    return np.bincount(task[own], weights=deps[own], minlength=n)[:n].astype(np.float64)


def drop_counts(graph, task_rank: np.ndarray, transfers, rank: int) -> np.ndarray:
    """Per task: where it runs on another rank than ``rank`` and is the first to write a tile since ``rank``
    received it, the dependencies of that copy's invalidation on ``rank``: the tasks ``rank`` ran that read the
    copy (the first, whose insertion posted the receive, and those after it; StarPU-MPI's cache is flushed
    between steps, so only receives of this step count)."""
    from tilecast.kernels.registry import W

    n = len(task_rank)
    out = np.zeros(n)
    sel = (np.asarray(transfers.dst) == rank) & ~np.asarray(transfers.back)
    if not sel.any():
        return out
    at = np.asarray(graph.access_task, dtype=np.int64)
    tile = np.asarray(graph.acc_tile, dtype=np.int64)
    writes = (np.asarray(graph.acc_mode) & W) != 0
    here = np.asarray(task_rank)[at] == rank
    span = n + 1
    wkey = np.sort(tile[writes] * span + at[writes])  # writes ordered by (tile, task)
    rkey = np.sort(tile[~writes & here] * span + at[~writes & here])  # reads on ``rank``, the same order
    rtile, rtask = np.asarray(transfers.tile)[sel].astype(np.int64), np.asarray(transfers.task)[sel].astype(np.int64)
    nxt = np.searchsorted(wkey, rtile * span + rtask, side="right")  # the first write after the receive's cause
    ok = nxt < len(wkey)
    ok[ok] = wkey[nxt[ok]] // span == rtile[ok]
    writer = np.where(ok, wkey[np.minimum(nxt, len(wkey) - 1)] % span, -1)
    ok &= np.asarray(task_rank)[np.maximum(writer, 0)] != rank
    readers = (np.searchsorted(rkey, rtile * span + writer, side="left")
               - np.searchsorted(rkey, rtile * span + rtask, side="right"))
    np.add.at(out, writer[ok], 1 + readers[ok])
    return out


def task_seconds(roles: dict, counts: np.ndarray) -> np.ndarray:
    """(ranks, tasks) seconds of each rank's main thread per task: ``counts`` (:func:`role_counts`) weighted by
    ``roles`` (seconds per role, :data:`ROLES`; a role a calibration did not fit costs nothing)."""
    return counts @ np.array([float(roles.get(k, 0.0)) for k in ROLES])


def fit_roles(counts: np.ndarray, seconds: np.ndarray, cpu_s=None, roles=ROLES) -> dict:
    """Seconds per role (``roles``, :data:`ROLES` or some of them in that order, as ``counts``' last axis;
    non-negative least squares) from per-task insertion times ``seconds``
    (the same shape as ``counts[..., 0]``; NaN where not timed). Insertions longer than :data:`PREEMPTED_S`
    (the thread lost its core in them) are left out. ``cpu_s`` (per rank, optional): the main threads' CPU time
    over the same insertions (``time.thread_time``); the fit is then scaled to it, so that the CPU of the
    insertions left out (they ran too, before and after losing the core) is counted, spread over the roles.

    ValueError when fewer than 2 timed insertions per role remain."""
    from scipy.optimize import nnls

    x = counts.reshape(-1, len(roles))
    y = np.asarray(seconds, dtype=np.float64).reshape(-1)
    if len(y) != len(x):
        raise ValueError(f"seconds: {len(y)} insertion times for {len(x)} (rank, task) pairs")
    keep = np.isfinite(y) & (y >= 0) & (y < PREEMPTED_S)
    short = [k for k, c in zip(roles, (x[keep] > 0).sum(axis=0)) if c < 2]
    if short:
        raise ValueError(f"seconds: too few timed insertions to fit the cost of {', '.join(short)}")
    coef, _ = nnls(x[keep], y[keep])
    if cpu_s is not None:
        cpu = float(np.sum(cpu_s))
        fitted = float((x[np.isfinite(y)] @ coef).sum())
        if cpu > 0 and fitted > 0:
            coef = coef * (cpu / fitted)
    return {k: float(v) for k, v in zip(roles, coef)}
