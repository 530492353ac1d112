"""When a tile message's reader can start on the receiving rank, and what it waited for: the hand-off between
ranks read from a run's traces put on one clock (``MPIRunResult.clock_shift_s``).

Per message of the insert-task model (:func:`tilecast.graph.owner_computes.plan`), on the shared clock:
``written`` (the sender's last writer of the tile ends), ``send`` (the sender's main thread inserts the
reader task: StarPU-MPI posts the detached send then, ``_starpu_mpi_exchange_data_before_execution``,
``mpi/src/starpu_mpi_task_insert.c``, StarPU 1.3.10; it leaves once the tile is written), ``recv`` (the
receiver's main thread inserts the reader: the detached receive is posted then; a message that arrives
earlier is early data, ``_starpu_mpi_receive_early_data``, ``mpi/src/mpi/starpu_mpi_mpi.c``), ``local`` (the
reader's inputs written on its own rank are ready), ``free`` (the receiving worker's task before the reader
ends) and ``start`` (the reader starts). ``ready`` is the latest of the five; ``start - ready`` is what no
submission, dependency or busy worker explains: the progress loops' polling, the transfer, the copy, and
time slices lost to other threads.
"""

from __future__ import annotations

import numpy as np

CAUSES = ("written", "send", "recv", "local", "free")


def handoffs(graph, transfers, task_rank, start, end, submit_at, shift) -> dict:
    """Per message (``transfers`` of :func:`~tilecast.graph.owner_computes.plan`): the times above (s, on the
    shared clock) and the cause. ``submit_at``: (ranks, tasks + 1) as ``MPIRunResult.submit_at_s``;
    ``shift``: per rank, as ``MPIRunResult.clock_shift_s``."""
    from tilecast.kernels.registry import W

    acc_ptr = np.asarray(graph.acc_ptr)
    acc_tile = np.asarray(graph.acc_tile).astype(np.int64)
    acc_mode = np.asarray(graph.acc_mode)
    access_task = np.asarray(graph.access_task).astype(np.int64)
    w = np.flatnonzero((acc_mode & W) != 0)
    order = np.lexsort((access_task[w], acc_tile[w]))
    wt, wtask = acc_tile[w][order], access_task[w][order]
    span = graph.n_tasks + 1
    key_w = wt * span + wtask

    def last_writer(tile: int, before: int) -> int:
        pos = int(np.searchsorted(key_w, tile * span + before, side="left")) - 1
        return int(wtask[pos]) if pos >= 0 and wt[pos] == tile else -1

    rank_of = np.asarray(task_rank)
    at = lambda t, r, x: float(x[t]) + float(shift[r])  # noqa: E731
    # each rank's worker's tasks in start order: the task before a reader
    by_rank = {}
    for r in range(len(shift)):
        idx = np.flatnonzero(rank_of == r)
        by_rank[r] = idx[np.argsort(start[idx], kind="stable")]
    pos_in = {}
    for r, idx in by_rank.items():
        pos_in.update({int(t): (r, i) for i, t in enumerate(idx)})
    rows = []
    for k in range(len(transfers)):
        task, tile = int(transfers.task[k]), int(transfers.tile[k])
        src, dst = int(transfers.src[k]), int(transfers.dst[k])
        if bool(transfers.back[k]) or rank_of[task] != dst:
            continue
        wr = last_writer(tile, task)
        written = at(wr, src, end) if wr >= 0 and rank_of[wr] == src else 0.0
        send = float(submit_at[src, task + 1]) + float(shift[src])
        recv = float(submit_at[dst, task + 1]) + float(shift[dst])
        local = 0.0
        for j in range(acc_ptr[task], acc_ptr[task + 1]):
            lw = last_writer(int(acc_tile[j]), task)
            if lw >= 0 and rank_of[lw] == dst:
                local = max(local, at(lw, dst, end))
        r, i = pos_in[task]
        free = at(by_rank[r][i - 1], r, end) if i > 0 else 0.0
        st = at(task, dst, start)
        terms = dict(written=written, send=send, recv=recv, local=local, free=free)
        ready = max(terms.values())
        rows.append(dict(task=task, tile=tile, src=src, dst=dst, start=st, ready=ready,
                         cause=max(terms, key=terms.get), **terms))
    return {k: np.array([row[k] for row in rows]) for k in (rows[0] if rows else {})}


def per_reader(h: dict) -> dict:
    """The messages grouped by reader task: a reader waits for all of its messages (the latest ``written``,
    ``send`` and ``recv`` of them; ``local``, ``free`` and ``start`` are the task's); the cause recomputed."""
    import pandas as pd

    df = pd.DataFrame({k: v for k, v in h.items() if k != "cause"})
    g = df.groupby("task", sort=False).agg(src=("src", "first"), dst=("dst", "first"), written=("written", "max"),
                                            send=("send", "max"), recv=("recv", "max"), local=("local", "first"),
                                            free=("free", "first"), start=("start", "first"),
                                            messages=("tile", "size")).reset_index()
    terms = g[list(CAUSES)].to_numpy()
    out = {k: g[k].to_numpy() for k in g.columns}
    out["ready"] = terms.max(axis=1)
    out["cause"] = np.array(CAUSES, dtype=object)[terms.argmax(axis=1)]
    return out
