"""What a message costs the worker that StarPU-MPI's progress thread runs, from the MPI calls' own times.

Where ``run --ranks`` lets the progress thread run worker 0 (:mod:`tilecast.executor.mpi_threads`), every MPI call
the rank makes happens between two of that worker's tasks (``_starpu_mpi_progress_thread_func``,
``mpi/src/mpi/starpu_mpi_mpi.c``, StarPU 1.3.10: a round posts ready requests, tests the pending ones and an
envelope, and calls ``starpu_driver_run_once`` only when no envelope came). A message is, on the sending side, two
``MPI_Isend`` (envelope and data), each completed by an ``MPI_Test``; on the receiving side, the envelope's
``MPI_Irecv`` and completion, then the data's ``MPI_Irecv`` and completion, each with StarPU-MPI's handling around
it (the envelope's match with an early request, the data's release to the tasks that wait for it). Timed with
:mod:`tilecast.executor.mpi_call_times`, each gap between the worker's consecutive tasks after its main thread has
submitted the step is fitted, by least squares over the gaps shorter than :data:`MAX_GAP_S`, as

    gap = base + a x tests + b x (send-side calls) + c x (receive-side calls)

(calls: posts and completions; tests: every ``MPI_Test``, a polling round's or a completing one). A message then
costs ``b`` times its send-side calls on one rank and ``c`` times its receive-side calls on the other, plus ``a``
for each of its completing tests (calls per message: those of the rank's step over the messages it sends or
receives; 4 and 4 on StarPU 1.3.10, two of each a completion). This counts what the gaps'
medians (:mod:`tilecast.loop.ranks_task_cost`) miss: the envelopes that arrive in bursts and are handled, round
after round, with no task in between, wherever in the step they come.
"""

from __future__ import annotations

import numpy as np

from tilecast.executor.mpi_call_times import IRECV, ISEND, ISSEND, TEST, WAIT, request_kinds

#: a gap this long or longer holds a wait (a dependency, a message in flight), not only the calls' work
MAX_GAP_S = 1e-3


def call_sides(calls) -> dict:
    """Per call, masks: ``tests`` (every ``MPI_Test``), ``send`` and ``recv`` (a side's posts and completions),
    ``send_done`` and ``recv_done`` (the completions alone)."""
    op = calls["op"]
    done = (calls["flag"] != 0) & np.isin(op, (TEST, WAIT))
    kind = request_kinds(calls)
    send_done, recv_done = done & (kind == ISEND), done & (kind == IRECV)
    return {"tests": op == TEST, "send": np.isin(op, (ISEND, ISSEND)) | send_done, "recv": (op == IRECV) | recv_done,
            "send_done": send_done, "recv_done": recv_done}


def gap_counts(calls, start, end, task_rank, rank: int, from_s: float, sides: dict | None = None) -> dict:
    """Per gap between ``rank``'s worker's consecutive tasks that begins at or after ``from_s``: its length and
    the calls made in it (``tests``, ``send``: posts and completions of sends, ``recv``: of receives;
    ``sides``: :func:`call_sides` of ``calls``, computed here when not given)."""
    sides = call_sides(calls) if sides is None else sides
    idx = np.flatnonzero(np.asarray(task_rank) == rank)
    idx = idx[np.argsort(np.asarray(start)[idx], kind="stable")]
    gap_start, gap_end = np.asarray(end)[idx[:-1]], np.asarray(start)[idx[1:]]
    keep = gap_start >= from_s
    gap_start, gap_end = gap_start[keep], gap_end[keep]
    t = calls["t_s"]
    lo, hi = np.searchsorted(t, gap_start), np.searchsorted(t, gap_end)

    def count(mask):
        c = np.concatenate([[0], np.cumsum(mask)])
        return (c[hi] - c[lo]).astype(np.float64)

    return {"gap_s": gap_end - gap_start, **{k: count(sides[k]) for k in ("tests", "send", "recv")}}


def step_calls(calls, end, task_rank, rank: int, sides: dict | None = None) -> tuple[float, float, float, float]:
    """The send-side and receive-side calls ``rank`` made over its step (from 0 to its last task's end), then of
    them the completing tests of sends and of receives (``sides``: :func:`call_sides` of ``calls``)."""
    sides = call_sides(calls) if sides is None else sides
    mine = np.asarray(task_rank) == rank
    within = (calls["t_s"] >= 0.0) & (calls["t_s"] <= float(np.nanmax(np.asarray(end)[mine])))
    return tuple(float((sides[k] & within).sum()) for k in ("send", "recv", "send_done", "recv_done"))


def fit_message_cpu(runs, call_cost_s: float = 0.0) -> dict | None:
    """The progress thread's CPU per message on each side (module docstring) from ``runs``: per run, ``(calls,
    start, end, task_rank, submit_end, sent, received)``: ``calls`` per rank on the clock of ``start``/``end``,
    ``submit_end`` per rank, ``sent``/``received`` the messages each rank sends and receives in a step;
    ``call_cost_s``: what recording a call added to it (taken off each call's fitted cost). None where no gap holds
    a message or a fitted cost comes out negative."""
    rows = {k: [] for k in ("gap_s", "tests", "send", "recv")}
    per_sent, per_received, done_sent, done_received = [], [], [], []
    for calls, start, end, task_rank, submit_end, sent, received in runs:
        for rank, rank_calls in enumerate(calls):
            sides = call_sides(rank_calls)  # once per rank: the requests' kinds walk every call
            g = gap_counts(rank_calls, start, end, task_rank, rank, float(submit_end[rank]), sides)
            short = g["gap_s"] < MAX_GAP_S
            for k in rows:
                rows[k].append(g[k][short])
            s, r, sd, rd = step_calls(rank_calls, end, task_rank, rank, sides)
            if sent[rank]:
                per_sent.append(s / sent[rank])
                done_sent.append(sd / sent[rank])
            if received[rank]:
                per_received.append(r / received[rank])
                done_received.append(rd / received[rank])
    gap, tests, send, recv = (np.concatenate(rows[k]) if rows[k] else np.zeros(0) for k in rows)
    if not len(gap) or send.sum() == 0 or recv.sum() == 0 or not per_sent or not per_received:
        return None
    x = np.stack([np.ones_like(gap), tests, send, recv], axis=1)
    (base, per_test, per_send, per_recv), *_ = np.linalg.lstsq(x, gap, rcond=None)
    per_send, per_recv = per_send - call_cost_s, per_recv - call_cost_s
    if min(per_send, per_recv) < 0:
        return None
    send_calls, recv_calls = float(np.mean(per_sent)), float(np.mean(per_received))
    # a completion is a test too: it costs a polling test's share besides its side's
    send_side = per_send * send_calls + max(per_test, 0.0) * float(np.mean(done_sent))
    recv_side = per_recv * recv_calls + max(per_test, 0.0) * float(np.mean(done_received))
    return {"message_cpu_s": float(0.5 * (send_side + recv_side)), "send_side_s": float(send_side),
            "recv_side_s": float(recv_side), "base_s": float(base), "per_test_s": float(per_test),
            "per_send_call_s": float(per_send), "per_recv_call_s": float(per_recv), "call_cost_s": float(call_cost_s),
            "send_calls_per_message": send_calls, "recv_calls_per_message": recv_calls, "gaps": int(len(gap)),
            "send_calls": int(send.sum()), "recv_calls": int(recv.sum())}
