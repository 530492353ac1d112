"""The ranks' main threads submitting the step beside their workers and progress threads.

Under StarPU-MPI every rank's main thread submits every task of the step, in order
(``starpu_mpi_task_insert``: it decides where the task runs, posts the detached sends and receives the task
needs, ``_starpu_mpi_isend_irecv_common`` in ``mpi/src/starpu_mpi.c``, and submits the task where it is
local), then sleeps in ``starpu_task_wait_for_all``. While it submits it is one more runnable thread per rank
on the cores the ranks share: a task (or a message) joins its rank's queues only once the main thread has had
the CPU time to submit it, and the workers and progress threads get less of the cores until submission ends.

How the rank's slots split between its main thread and that worker thread while it submits is measured on
``calibrate --ranks``'s probe step (``Network.submit_share``: the main thread's CPU over its own and the
rank's worker threads' between the barrier and the submission's end, from the scheduler's per-thread counts,
:func:`tilecast.executor.mpi_threads.submit_share_of`); half each where not measured (:data:`EVEN_SHARE`).

The rule (:class:`Submitting`): the main thread shares the time slots of the rank's first worker thread
(the one StarPU-MPI's progress thread drives where ``run --ranks`` lets it). Linux shares the CPU between
sessions before threads (autogroups, ``kernel/sched/autogroup.c``; ``run --ranks`` starts its ranks in a
session of their own), so a thread that wakes in the ranks' session takes time from the session's own
threads, not from other work: while rank r submits, its main thread and that worker each get half of the
worker's slots (processor sharing within the slot), and the other threads keep theirs.
:func:`release_times` gives, per task index, when each rank's main thread has submitted it, from its CPU time
per task (``submit_cpu_task_s``, measured with ``time.thread_time`` around the submission of a probe step,
:mod:`tilecast.loop.ranks_probe`), or from its CPU time per task by its role in each task
(:mod:`tilecast.simulator.submit_roles`).
"""

from __future__ import annotations

import numpy as np

from tilecast.simulator.ranks_threads import CoreSharing


def main_threads_share(sharing: CoreSharing) -> bool:
    """Whether the main threads must share a thread's slots: not where every thread, they included, has a
    core of its own."""
    return sharing.threads + sharing.ranks + sharing.background > sharing.cores


#: the main thread's part of its rank's slots while it submits, where nothing was measured: Linux's fair share of
#: two runnable threads of equal weight
EVEN_SHARE = 0.5


def check_share(share: float) -> float:
    """``share`` as a float, or ValueError unless 0 < share < 1."""
    share = float(share)
    if not 0.0 < share < 1.0:
        raise ValueError(f"submit_share must be between 0 and 1 (the main thread's part of its rank's slots), "
                         f"got {share!r}")
    return share


def release_times(sharing: CoreSharing, n_tasks: int, cpu_per_task_s, share: float = EVEN_SHARE) -> np.ndarray:
    """(ranks, n_tasks): when each rank's main thread has submitted task i: the CPU time of tasks 0..i at
    ``share`` of the rate of the rank's first worker thread's slots (at full rate on a core of its own).
    ``cpu_per_task_s``: seconds per task, one figure for every rank and task, or (ranks, n_tasks) of them
    (:func:`tilecast.simulator.submit_roles.task_seconds`). ``share``: the main thread's part of those slots
    while it submits (:data:`EVEN_SHARE`, or the probe's measurement, ``Network.submit_share``)."""
    rate = 1.0 / check_share(share) if main_threads_share(sharing) else 1.0
    if np.ndim(cpu_per_task_s) == 0:
        done = np.tile(rate * np.arange(1, n_tasks + 1) * float(cpu_per_task_s), (sharing.ranks, 1))
    else:
        done = rate * np.cumsum(np.broadcast_to(np.asarray(cpu_per_task_s, dtype=np.float64),
                                                (sharing.ranks, n_tasks)), axis=1)
    out = np.empty((sharing.ranks, n_tasks))
    for r in range(sharing.ranks):
        th = sharing.worker_thread(r, 0)
        for i in range(n_tasks):
            out[r, i] = sharing.finish(th, 0.0, float(done[r, i]))
    return out


class Submitting:
    """``after`` (a :class:`CoreSharing`) where rank r's first worker thread runs at ``1 - share`` of its speed
    until ``until[r]`` s (its main thread has ``share`` of its slots; unless every thread has a core of its own).
    Everything but :meth:`finish` and :meth:`step_end` is ``after``'s."""

    def __init__(self, after: CoreSharing, until, share: float = EVEN_SHARE):
        self.after = after
        self.share = check_share(share)
        self.until = [float(u) for u in until]
        self.shared_thread = ({after.worker_thread(r, 0): u for r, u in enumerate(self.until)}
                              if main_threads_share(after) else {})

    def __getattr__(self, name):
        return getattr(self.after, name)

    @property
    def submit_end(self) -> float:
        return max(self.until) if self.until else 0.0

    def finish(self, thread: int, t: float, work: float) -> float:
        until = self.shared_thread.get(thread)
        if until is not None and t < until and work > 0.0:
            left = 1.0 - self.share
            avail = left * self.after.on_time(thread, t, until)
            if work <= avail:
                return min(self.after.finish(thread, t, work / left), until)
            work -= avail
            t = until
        return self.after.finish(thread, t, work)

    def step_end(self, rank_end) -> float:
        """The step cannot end before every rank's main thread has submitted it."""
        return self.after.step_end([max(t, u) for t, u in zip(rank_end, self.until)])
