"""What a task costs a rank's worker between kernels under StarPU-MPI, measured on the probe step's traces.

Where ``run --ranks`` lets StarPU-MPI's progress thread run worker 0 (:mod:`tilecast.executor.mpi_threads`),
that thread goes once around the progress loop before every task it runs
(``_starpu_mpi_progress_thread_func``, ``mpi/src/mpi/starpu_mpi_mpi.c``, StarPU 1.3.10: the ready receives and
sends, ``_starpu_mpi_test_detached_requests``' ``MPI_Test`` of every posted request, ``_starpu_mpi_comm_test_recv``
for an envelope, and only when none came ``starpu_driver_run_once``). The one-process fit of the runtime's cost
per task (``HostCost.flat_task_overhead_s``) has no such round. The gaps between the worker's consecutive tasks
in the probe's traces, after the rank's main thread has submitted the step (so the worker has its core to
itself but for other work), measure it:

- ``progress_task_s``: the mean gap before a task whose inputs are all local and whose predecessor sent
  nothing, less the forecast's one-process cost per task; charged before every task of a worker that the
  progress thread runs (:class:`tilecast.simulator.ranks_threads.ThreadedRankEngine`);
- ``message_cpu_s``: the extra median gap after a task whose output a message carries (posting the send) and
  before a task that reads a received tile (the envelope, the ``MPI_Irecv``, its completion and the tile's
  release), each over the plain gaps' median, averaged over the two sides: the progress thread's CPU per
  message on each side (before: the ping-pong's ``message_s / 2``).

Gaps longer than :data:`WAIT_S` are waits (a dependency, a message in flight, a time slice lost to other work),
not work between tasks, and are left out.
"""

from __future__ import annotations

import numpy as np

#: a gap longer than this is a wait, not the runtime's work between two tasks (the one-process cost is 2-6 us,
#: a time slice 4 ms)
WAIT_S = 50e-6


def sent_after(graph, transfers, rank: int) -> np.ndarray:
    """Per task: True where it is, on ``rank``, the last writer before a message's cause of a tile ``rank`` sends
    (a tile sent back: the message's own task)."""
    from tilecast.kernels.registry import W

    out = np.zeros(graph.n_tasks, dtype=bool)
    mine = np.flatnonzero(np.asarray(transfers.src) == rank)
    if not len(mine):
        return out
    w = np.flatnonzero((np.asarray(graph.acc_mode) & W) != 0)
    wt = np.asarray(graph.acc_tile)[w].astype(np.int64)
    wtask = np.asarray(graph.access_task)[w].astype(np.int64)
    order = np.lexsort((wtask, wt))
    wt, wtask = wt[order], wtask[order]
    span = graph.n_tasks + 1
    task = np.asarray(transfers.task)[mine].astype(np.int64)
    tile = np.asarray(transfers.tile)[mine].astype(np.int64)
    before = np.where(np.asarray(transfers.back)[mine], task + 1, task)  # writers before this position
    pos = np.searchsorted(wt * span + wtask, tile * span + before) - 1
    ok = pos >= 0
    ok[ok] = wt[pos[ok]] == tile[ok]
    out[wtask[pos[ok]]] = True
    return out


def received(transfers, n_tasks: int) -> np.ndarray:
    """Per task: True where it is the first reader of a tile fetched from another rank (the message's cause)."""
    out = np.zeros(n_tasks, dtype=bool)
    out[np.asarray(transfers.task)[~np.asarray(transfers.back)]] = True
    return out


def classified_gaps(start, end, task_rank, rank: int, from_s: float, recv, sent) -> dict:
    """The gaps between ``rank``'s worker's consecutive tasks (one worker per rank) starting at or after
    ``from_s``, below :data:`WAIT_S`, by class of the task after the gap: ``recv`` (it reads a received tile),
    ``sent`` (the task before it wrote a tile that leaves), ``plain`` (neither)."""
    idx = np.flatnonzero(np.asarray(task_rank) == rank)
    idx = idx[np.argsort(np.asarray(start)[idx], kind="stable")]
    gap = start[idx[1:]] - end[idx[:-1]]
    nxt, prv = idx[1:], idx[:-1]
    keep = (start[nxt] >= from_s) & (gap >= 0) & (gap < WAIT_S)
    is_recv = recv[nxt]
    is_sent = sent[prv] & ~is_recv
    plain = ~is_recv & ~is_sent
    return {"plain": gap[keep & plain], "recv": gap[keep & is_recv], "sent": gap[keep & is_sent]}


def fit_task_costs(traces, graph, transfers, flat_overhead_s: float) -> dict | None:
    """``progress_task_s`` and ``message_cpu_s`` (module docstring) from ``traces``: per run and rank
    (start, end, task_rank, the rank's submission end), times of one step of ``graph`` with the messages
    ``transfers``; ``flat_overhead_s``: the forecast's one-process cost per task. Also the figures they come
    from. None when no rank has plain gaps after its submission."""
    recv = received(transfers, graph.n_tasks)
    ranks = int(max(np.max(np.asarray(transfers.src), initial=0), np.max(np.asarray(transfers.dst), initial=0))) + 1
    plain, extra_send, extra_recv, per = [], [], [], []
    for start, end, task_rank, submit_end in traces:
        start, end = np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)
        for r in range(ranks):
            g = classified_gaps(start, end, task_rank, r, float(submit_end[r]), recv,
                                sent_after(graph, transfers, r))
            if not len(g["plain"]):
                continue
            base = float(np.median(g["plain"]))
            plain.append(g["plain"])
            if len(g["sent"]):
                extra_send.append(float(np.median(g["sent"])) - base)
            if len(g["recv"]):
                extra_recv.append(float(np.median(g["recv"])) - base)
            per.append({"plain_mean_s": float(g["plain"].mean()), "plain_median_s": base,
                        "plain": int(len(g["plain"])), "sent": int(len(g["sent"])), "recv": int(len(g["recv"]))})
    if not plain:
        return None
    mean_gap = float(np.concatenate(plain).mean())
    sides = [float(np.median(x)) for x in (extra_send, extra_recv) if x]
    return {"progress_task_s": max(mean_gap - flat_overhead_s, 0.0), "gap_mean_s": mean_gap,
            "flat_overhead_s": float(flat_overhead_s),
            "message_cpu_s": max(float(np.mean(sides)), 0.0) if sides else None,
            "send_extra_s": float(np.median(extra_send)) if extra_send else None,
            "recv_extra_s": float(np.median(extra_recv)) if extra_recv else None, "per_rank": per}
