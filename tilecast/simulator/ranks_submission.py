"""The ranks' main threads submitting the step beside their workers and progress threads.

Under StarPU-MPI every rank's main thread submits every task of the step, in order
(``starpu_mpi_task_insert``: it decides where the task runs, posts the detached sends and receives the task
needs, ``_starpu_mpi_isend_irecv_common`` in ``mpi/src/starpu_mpi.c``, and submits the task where it is
local), then sleeps in ``starpu_task_wait_for_all``. While it submits it is one more runnable thread per rank
on the cores the ranks share: a task (or a message) joins its rank's queues only once the main thread has had
the CPU time to submit it, and the workers and progress threads get less of the cores until submission ends.

:class:`Submitting` is a :class:`~tilecast.simulator.ranks_threads.CoreSharing` in two phases: until
``until`` (every rank's submission done) the threads are those of
:meth:`CoreSharing.with_main_threads`, after it the plain ones. :func:`release_times` gives, per task index,
when each rank's main thread has submitted it, from its CPU time per task (``submit_cpu_task_s``, measured
with ``time.thread_time`` around the submission of a probe step, :mod:`tilecast.loop.ranks_probe`).
"""

from __future__ import annotations

import numpy as np

from tilecast.simulator.ranks_threads import CoreSharing


def submission_end(during: CoreSharing, rank: int, work_s: float) -> float:
    """When ``rank``'s main thread, runnable from 0 under ``during``, has had ``work_s`` s of CPU."""
    return during.finish(during.main_thread(rank), 0.0, work_s)


def release_times(sharing: CoreSharing, n_tasks: int, cpu_per_task_s: float) -> np.ndarray:
    """(ranks, n_tasks): when each rank's main thread has submitted task i (i + 1 tasks' CPU time, on the cores
    it shares with the ranks' other threads while they all submit)."""
    during = sharing.with_main_threads()
    out = np.empty((sharing.ranks, n_tasks))
    for r in range(sharing.ranks):
        th = during.main_thread(r)
        for i in range(n_tasks):
            out[r, i] = during.finish(th, 0.0, (i + 1) * cpu_per_task_s)
    return out


class Submitting:
    """``after`` (a :class:`CoreSharing` without main threads) with each rank's main thread runnable until
    ``until`` s. Thread numbers are ``after``'s (:meth:`CoreSharing.worker_thread`,
    :meth:`CoreSharing.progress_thread`); everything but time goes to ``after``."""

    def __init__(self, after: CoreSharing, until: float):
        if after.main_threads:
            raise ValueError("after: a sharing without main threads")
        self.after, self.during, self.until = after, after.with_main_threads(), float(until)

    def __getattr__(self, name):
        return getattr(self.after, name)

    def _during(self, thread: int) -> int:
        """``after``'s thread number in ``during``'s numbering (each rank has one thread more there)."""
        per = self.after.threads_per_rank
        return (thread // per) * (per + 1) + thread % per

    def next_on(self, thread: int, t: float) -> float:
        if t < self.until:
            got = self.during.next_on(self._during(thread), t)
            if got < self.until:
                return got
            t = self.until
        return self.after.next_on(thread, t)

    def next_turn(self, thread: int, t: float) -> float:
        if t < self.until:
            got = self.during.next_turn(self._during(thread), t)
            if got < self.until:
                return got
            t = self.until
        return self.after.next_turn(thread, t)

    def finish(self, thread: int, t: float, work: float) -> float:
        if t < self.until and work > 0.0:
            d = self._during(thread)
            have = self.during.on_time(d, t, self.until)
            if work <= have:
                return min(self.during.finish(d, t, work), self.until)
            work -= have
            t = self.until
        return self.after.finish(thread, t, work)

    def step_end(self, rank_end) -> float:
        """The step cannot end before every rank's main thread has submitted it."""
        return self.after.step_end([max(t, self.until) for t in rank_end])
