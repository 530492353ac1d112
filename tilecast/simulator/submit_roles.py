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
  implicit dependencies.

The costs per role are fitted on a probe step's per-task insertion times (:func:`fit_roles`,
:mod:`tilecast.loop.ranks_probe`); :func:`task_seconds` gives each rank's cost of each task of another step
from its plan (:func:`tilecast.graph.owner_computes.plan`). On the 2-core AMD EPYC (load 8) a task the rank
runs took 1.0-1.3 us, one it does not 0.15-0.25 us, and each send or receive it posts some 2-5 us more, so
the same count of tasks costs a ``data`` step (one message per 15 tasks) more than a ``layer`` one (one per 30).
"""

from __future__ import annotations

import numpy as np

ROLES = ("exec", "other", "send", "recv")
PREEMPTED_S = 100e-6  # an insertion longer than this lost its core meanwhile: left out of the fit


def role_counts(task_rank: np.ndarray, transfers, ranks: int) -> np.ndarray:
    """(ranks, tasks, 4): per rank and task, the counts of :data:`ROLES`: whether the rank runs the task, whether
    it does not, the messages of the task it sends and those it receives (``transfers``: the plan's, each
    posted by its sender's and its receiver's main thread while they insert the task that causes it)."""
    task_rank = np.asarray(task_rank)
    n = len(task_rank)
    out = np.zeros((ranks, n, len(ROLES)))
    for r in range(ranks):
        runs = task_rank == r
        out[r, :, 0] = runs
        out[r, :, 1] = ~runs
        out[r, :, 2] = np.bincount(transfers.task[transfers.src == r], minlength=n)[:n]
        out[r, :, 3] = np.bincount(transfers.task[transfers.dst == r], minlength=n)[:n]
    return out


def task_seconds(roles: dict, counts: np.ndarray) -> np.ndarray:
    """(ranks, tasks) seconds of each rank's main thread per task: ``counts`` (:func:`role_counts`) weighted by
    ``roles`` (seconds per role, :data:`ROLES`)."""
    return counts @ np.array([float(roles[k]) for k in ROLES])


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
