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
threads, not from other work: while rank r submits, its main thread and that worker split the worker's
slots, and the other threads keep theirs. How they split them (:class:`Turns`, the default): in turns of a
whole time slice, as Linux runs two CPU-bound threads on one core (a running thread keeps the core until the
tick that ends its slice, :func:`tilecast.simulator.ranks_threads.tick_slice_s`), the main thread first (it
woke to submit) and the worker one slice in every ``slice / (1 - share)`` of the slots' time. So a worker that
drives StarPU-MPI's progress neither runs tasks nor polls between its turns: a message posted during the
submission waits for the turn of its sender's worker, then of its receiver's. Measured on the 2-core Intel
Xeon (``data`` at tile 32, submissions of 35-40 ms): the worker ran in one burst of 2-6 ms some 20-30 ms into
its rank's submission, and no task that reads a received tile started before the submissions ended. The
earlier rule, processor sharing within the slot (each thread at its part of the slot's speed, the worker
polling whenever the slot is on), is kept as ``turns=False``.
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


def release_times(sharing: CoreSharing, n_tasks: int, cpu_per_task_s, share: float = EVEN_SHARE,
                  turns: bool = True) -> np.ndarray:
    """(ranks, n_tasks): when each rank's main thread has submitted task i: the CPU time of tasks 0..i in its
    part of the rank's first worker thread's slots (at full rate on a core of its own). ``cpu_per_task_s``:
    seconds per task, one figure for every rank and task, or (ranks, n_tasks) of them
    (:func:`tilecast.simulator.submit_roles.task_seconds`). ``share``: the main thread's part of those slots
    while it submits (:data:`EVEN_SHARE`, or the probe's measurement, ``Network.submit_share``); ``turns``:
    that part taken in turns of a slice (:class:`Turns`), else at ``share`` of the slots' speed throughout."""
    shared = main_threads_share(sharing)
    rate = 1.0 / check_share(share) if shared and not turns else 1.0
    if np.ndim(cpu_per_task_s) == 0:
        done = np.tile(rate * np.arange(1, n_tasks + 1) * float(cpu_per_task_s), (sharing.ranks, 1))
    else:
        done = rate * np.cumsum(np.broadcast_to(np.asarray(cpu_per_task_s, dtype=np.float64),
                                                (sharing.ranks, n_tasks)), axis=1)
    if shared and turns:
        done = np.stack([rank_turns(sharing, share, r).main_slot_time(done[r]) for r in range(sharing.ranks)])
    out = np.empty((sharing.ranks, n_tasks))
    for r in range(sharing.ranks):
        th = sharing.worker_thread(r, 0)
        for i in range(n_tasks):
            out[r, i] = sharing.finish(th, 0.0, float(done[r, i]))
    return out


def rank_turns(sharing: CoreSharing, share: float, rank: int) -> "Turns":
    """Rank ``rank``'s :class:`Turns`: the ranks' patterns spread evenly over a period."""
    return Turns(sharing.slice_s, share, phase=rank / sharing.ranks)


class Turns:
    """The turns of a rank's main thread and its worker thread on the worker's slots while the main thread
    submits, in the slots' own time ``u`` (the seconds the worker's thread has been on a core since the
    submission began): periods of ``slice_s / (1 - share)``, the main thread's turn first and the worker's
    last slice of each period its own, the pattern shifted by ``phase`` of a period (the ranks' cores do not
    run in step). Over a period each gets its part (``share``, ``1 - share``); with the even split, one slice
    each, in turn."""

    def __init__(self, slice_s: float, share: float, phase: float = 0.0):
        self.slice = float(slice_s)
        self.share = check_share(share)
        self.period = self.slice / (1.0 - self.share)
        self.main = self.period - self.slice  # the main thread's turn at the start of each period
        self.offset = (float(phase) % 1.0) * self.period

    def _worker(self, x):  # the worker's time in [0, x) of the unshifted pattern (x may be negative)
        n = np.floor(x / self.period)
        return n * self.slice + np.clip(x - n * self.period - self.main, 0.0, self.slice)

    def worker_time(self, u: float) -> float:
        """The worker's seconds on the core in slot time [0, u)."""
        return float(self._worker(u - self.offset) - self._worker(-self.offset))

    def worker_reaches(self, w: float) -> float:
        """The slot time at which the worker has had ``w`` seconds (> 0) of its turns."""
        w = w + self._worker(-self.offset)
        n = np.ceil(w / self.slice) - 1
        return float(n * self.period + self.main + (w - n * self.slice) + self.offset)

    def main_slot_time(self, m):
        """The slot time at which the main thread has had ``m`` seconds (> 0; an array or a number)."""
        x0 = -self.offset
        m = np.asarray(m, dtype=np.float64) + (x0 - self._worker(x0))
        n = np.ceil(m / self.main) - 1
        return n * self.period + (m - n * self.main) + self.offset

    def next_worker_turn(self, u: float) -> float:
        """The earliest slot time from ``u`` in a turn of the worker."""
        x = u - self.offset
        n = np.floor(x / self.period)
        return float(max(u, n * self.period + self.main + self.offset))


class Submitting:
    """``after`` (a :class:`CoreSharing`) where rank r's first worker thread has only its part of its slots until
    ``until[r]`` s, while its main thread submits (``share`` of them are the main thread's; unless every thread
    has a core of its own): in turns of a slice (:class:`Turns`, ``turns=True``), or at ``1 - share`` of its
    speed throughout. Everything but :meth:`finish`, :meth:`next_on` and :meth:`step_end` is ``after``'s."""

    def __init__(self, after: CoreSharing, until, share: float = EVEN_SHARE, turns: bool = True):
        self.after = after
        self.share = check_share(share)
        self.until = [float(u) for u in until]
        self.turns = ({after.worker_thread(r, 0): rank_turns(after, self.share, r) for r in range(len(self.until))}
                      if turns else None)
        self.shared_thread = ({after.worker_thread(r, 0): u for r, u in enumerate(self.until)}
                              if main_threads_share(after) else {})

    def __getattr__(self, name):
        return getattr(self.after, name)

    @property
    def submit_end(self) -> float:
        return max(self.until) if self.until else 0.0

    def _slot_time(self, thread: int, t: float) -> float:
        return self.after.on_time(thread, 0.0, t)

    def _at_slot_time(self, thread: int, u: float) -> float:
        return self.after.finish(thread, 0.0, u) if u > 0.0 else self.after.next_on(thread, 0.0)

    def finish(self, thread: int, t: float, work: float) -> float:
        until = self.shared_thread.get(thread)
        if until is not None and t < until and work > 0.0:
            if self.turns is None:
                left = 1.0 - self.share
                avail = left * self.after.on_time(thread, t, until)
                if work <= avail:
                    return min(self.after.finish(thread, t, work / left), until)
            else:
                tu = self.turns[thread]
                w0 = tu.worker_time(self._slot_time(thread, t))
                avail = tu.worker_time(self._slot_time(thread, until)) - w0
                if work <= avail:
                    end = self._at_slot_time(thread, tu.worker_reaches(w0 + work))
                    return min(max(end, t + work), until)
            work -= avail
            t = until
        return self.after.finish(thread, t, work)

    def next_on(self, thread: int, t: float) -> float:
        """When ``thread`` is next on a core from ``t``: during its rank's submission, in the worker's turns."""
        until = self.shared_thread.get(thread)
        if until is None or self.turns is None or t >= until:
            return self.after.next_on(thread, t)
        u = self._slot_time(thread, t)
        nxt = self.turns[thread].next_worker_turn(u)
        at = self.after.next_on(thread, t if nxt <= u else max(t, self._at_slot_time(thread, nxt)))
        return at if at < until else self.after.next_on(thread, until)

    def step_end(self, rank_end) -> float:
        """The step cannot end before every rank's main thread has submitted it."""
        return self.after.step_end([max(t, u) for t, u in zip(rank_end, self.until)])
