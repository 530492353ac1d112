"""One trace of every rank's last step: tasks per rank, and the tiles sent between ranks.

Rows follow the trace schema (:mod:`tilecast.trace`) with ``node`` = the rank
that ran the task (one Perfetto process per rank) and ``worker`` = its
worker on that rank. Transfers are rows of kernel ``transfer`` (task -1)
from the insert-task model (:mod:`tilecast.graph.owner_computes`), the
messages StarPU-MPI sends, checked against its byte counts: ``node`` the
receiving rank, ``worker`` MPI_TRACK + the sending rank, and a window, not a
measured duration: from the end of the task that last wrote the tile (or the
step's start) to the start of the first task on the receiving rank that reads
it (or of the owner's next task, for a tile sent back), the two on one clock
where the ranks recorded it (``MPIRunResult.clock_shift_s``), drawn on the
receiving rank's. Where the run timed its MPI calls (``run_mpi(...,
mpi_calls=True)``), each rank's posts (``MPI_Isend``, ``MPI_Irecv``) and the
tests that completed them are rows too, as measured, on its ``MPI calls``
track (``worker`` MPI_CALLS_TRACK, ``task`` -1; the polling tests that found
nothing are left out).
"""

from __future__ import annotations

import json

import numpy as np

from tilecast import trace as tracefile

MPI_TRACK = tracefile.MPI_TRACK


def merged_trace(res):
    """The last step of a :class:`~tilecast.executor.mpi_launch.MPIRunResult` as one trace."""
    from tilecast.graph.distribution import distribute  # res.graph is the graph as run: owners as they were
    from tilecast.graph.owner_computes import plan
    from tilecast.kernels import all_kernels

    graph = res.graph
    names = np.array([k.name for k in all_kernels()], dtype=object)
    tags = np.array(graph.tags, dtype=object)[graph.tag] if graph.n_tasks else np.zeros(0, dtype=object)
    ran = np.flatnonzero(res.task_rank >= 0)
    tasks = dict(task=ran.astype(np.int64), kernel=names[graph.kernel[ran]], worker=res.worker[ran],
                 node=res.task_rank[ran].astype(np.int64), start_s=res.start_s[ran], end_s=res.end_s[ran],
                 bytes=np.asarray(graph.bytes, dtype=np.int64)[ran], flops=graph.flops[ran], tag=tags[ran])
    p = plan(graph, distribute(graph, res.ranks, res.distribution).owner, res.ranks)
    t = p.transfers
    # When each tile was last written before each transfer's task, and when its first reader there started:
    # on one clock where the ranks recorded it (clock_shift_s), then on the receiving rank's, where it is drawn
    shift = np.zeros(res.ranks) if getattr(res, "clock_shift_s", None) is None else np.asarray(res.clock_shift_s)
    on = np.where(res.task_rank >= 0, shift[np.maximum(res.task_rank, 0)], 0.0)
    last_write_end = np.maximum(_last_write_end(graph, res.end_s + on, t.task, t.tile) - shift[t.dst], 0.0)
    until = np.nan_to_num(res.start_s[t.task], nan=0.0)
    rows = dict(task=np.full(len(t), -1, np.int64), kernel=np.full(len(t), "transfer", dtype=object),
                worker=(MPI_TRACK + t.src).astype(np.int64), node=t.dst.astype(np.int64),
                start_s=np.minimum(last_write_end, until), end_s=until, bytes=t.nbytes.astype(np.int64),
                flops=np.zeros(len(t)), tag=np.array([f"mpi {s}->{d}" for s, d in zip(t.src, t.dst)], dtype=object))
    parts = [tasks, rows] + ([call_rows(res)] if getattr(res, "mpi_calls", None) is not None else [])
    cols = {k: np.concatenate([part[k] for part in parts]) for k in tasks}
    return tracefile.make_trace(**cols, source="real")


def call_rows(res) -> dict:
    """Trace rows of each rank's MPI posts and completing tests within its last step (module docstring)."""
    from tilecast.executor.mpi_call_times import IRECV, ISEND, ISSEND, TEST, WAIT, request_kinds

    out = {k: [] for k in ("task", "kernel", "worker", "node", "start_s", "end_s", "bytes", "flops", "tag")}
    for rank, calls in enumerate(res.mpi_calls):
        mine = res.task_rank == rank
        end = float(np.nanmax(res.end_s[mine])) if mine.any() else 0.0
        kind = request_kinds(calls)
        op = calls["op"]
        done = np.isin(op, (TEST, WAIT)) & (calls["flag"] != 0) & (kind != 0)
        keep = (np.isin(op, (ISEND, ISSEND, IRECV)) | done) & (calls["t_s"] >= 0.0) & (calls["t_s"] <= end)
        c, k = calls[keep], kind[keep]
        post_send, post_recv = np.isin(c["op"], (ISEND, ISSEND)), c["op"] == IRECV
        name = np.where(post_send, "MPI_Isend", np.where(post_recv, "MPI_Irecv",
                                                         np.where(k == ISEND, "send done", "receive done")))
        tag = np.array([f"to rank {p}" if s else (f"from rank {p}" if r else "") for s, r, p in
                        zip(post_send, post_recv, c["peer"].tolist())], dtype=object)
        n = len(c)
        out["task"].append(np.full(n, -1, np.int64))
        out["kernel"].append(name.astype(object))
        out["worker"].append(np.full(n, tracefile.MPI_CALLS_TRACK, np.int64))
        out["node"].append(np.full(n, rank, np.int64))
        out["start_s"].append(c["t_s"])
        out["end_s"].append(c["t_s"] + c["dur_us"].astype(np.float64) * 1e-6)
        out["bytes"].append(c["bytes"].astype(np.int64))
        out["flops"].append(np.zeros(n))
        out["tag"].append(tag)
    return {k: np.concatenate(v) if v else np.zeros(0) for k, v in out.items()}


def _last_write_end(graph, end_s, before_task, tile) -> np.ndarray:
    """Per (task, tile): the end of the latest task before ``task`` that wrote ``tile`` (0: none)."""
    from tilecast.kernels.registry import W

    w = np.flatnonzero((graph.acc_mode & W) != 0)
    wt, wtask = graph.acc_tile[w].astype(np.int64), graph.access_task[w]
    order = np.lexsort((wtask, wt))
    wt, wtask = wt[order], wtask[order]
    key_w = wt * (graph.n_tasks + 1) + wtask
    key_q = tile.astype(np.int64) * (graph.n_tasks + 1) + before_task
    pos = np.searchsorted(key_w, key_q, side="left") - 1
    ok = (pos >= 0) & (wt[np.maximum(pos, 0)] == tile)
    out = np.zeros(len(tile))
    out[ok] = np.nan_to_num(end_s[wtask[pos[ok]]], nan=0.0)
    return out


def save_merged(df, path: str, res) -> str:
    """Save like :func:`tilecast.trace.save`; in Chrome JSON, processes are named by rank, transfers are
    drawn on a 'from rank S' track of the receiving rank and timed MPI calls on an 'MPI calls (timed)' track."""
    if not path.lower().endswith(".json"):
        return tracefile.save(tracefile.with_step_time(df, res.step_s[-1]), path, res.graph)
    chrome = tracefile.to_chrome(df, res.graph)
    for e in chrome["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            e["args"]["name"] = f"rank {e['pid']}"
    for r in range(res.ranks):
        for s in range(res.ranks):
            chrome["traceEvents"].append({"ph": "M", "name": "thread_name", "pid": r, "tid": MPI_TRACK + s,
                                          "args": {"name": f"MPI from rank {s}"}})
        if getattr(res, "mpi_calls", None) is not None:
            chrome["traceEvents"].append({"ph": "M", "name": "thread_name", "pid": r,
                                          "tid": tracefile.MPI_CALLS_TRACK, "args": {"name": "MPI calls (timed)"}})
    with open(path, "w") as f:
        f.write(json.dumps(chrome))
    return path
