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
  probe's ``layer`` step; fitted per dependency, 0.6-1.0 us in both and in a ``data`` step of tile 64.

The costs per role are fitted on a probe step's per-task insertion times (:func:`fit_roles`,
:mod:`tilecast.loop.ranks_probe`); :func:`task_seconds` gives each rank's cost of each task of another step
from its plan (:func:`tilecast.graph.owner_computes.plan`). On the 2-core AMD EPYC (load 8) a task the rank
runs took 1.0-1.3 us, one it does not 0.15-0.25 us, and each send or receive it posts some 2-5 us more, so
the same count of tasks costs a ``data`` step (one message per 15 tasks) more than a ``layer`` one (one per 30).
"""

from __future__ import annotations

import numpy as np

ROLES = ("exec", "other", "send", "recv", "drop")
PREEMPTED_S = 100e-6  # an insertion longer than this lost its core meanwhile: left out of the fit


def role_counts(task_rank: np.ndarray, transfers, ranks: int, graph=None) -> np.ndarray:
    """(ranks, tasks, 5): per rank and task, the counts of :data:`ROLES`: whether the rank runs the task, whether
    it does not, the messages of the task it sends and those it receives (``transfers``: the plan's, each
    posted by its sender's and its receiver's main thread while they insert the task that causes it), and the
    dependencies of the received copies it drops for the task (:func:`drop_counts`; zero without ``graph``)."""
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
    return out


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


def fit_roles(counts: np.ndarray, seconds: np.ndarray, cpu_s=None) -> dict:
    """Seconds per role (:data:`ROLES`, non-negative least squares) from per-task insertion times ``seconds``
    (the same shape as ``counts[..., 0]``; NaN where not timed). Insertions longer than :data:`PREEMPTED_S`
    (the thread lost its core in them) are left out. ``cpu_s`` (per rank, optional): the main threads' CPU time
    over the same insertions (``time.thread_time``); the fit is then scaled to it, so that the CPU of the
    insertions left out (they ran too, before and after losing the core) is counted, spread over the roles.

    ValueError when fewer than 2 timed insertions per role remain."""
    from scipy.optimize import nnls

    x = counts.reshape(-1, len(ROLES))
    y = np.asarray(seconds, dtype=np.float64).reshape(-1)
    if len(y) != len(x):
        raise ValueError(f"seconds: {len(y)} insertion times for {len(x)} (rank, task) pairs")
    keep = np.isfinite(y) & (y >= 0) & (y < PREEMPTED_S)
    short = [k for k, c in zip(ROLES, (x[keep] > 0).sum(axis=0)) if c < 2]
    if short:
        raise ValueError(f"seconds: too few timed insertions to fit the cost of {', '.join(short)}")
    coef, _ = nnls(x[keep], y[keep])
    if cpu_s is not None:
        cpu = float(np.sum(cpu_s))
        fitted = float((counts.reshape(-1, len(ROLES))[np.isfinite(y)] @ coef).sum())
        if cpu > 0 and fitted > 0:
            coef = coef * (cpu / fitted)
    return {k: float(v) for k, v in zip(ROLES, coef)}
