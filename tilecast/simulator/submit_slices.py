"""The thread that submits the graph, taking its turns on a worker's core.

Where StarPU has a CPU worker on every core, the executor's submitting thread
has no core of its own: while it submits, three threads want two cores. Linux
does not spread that evenly over both cores at the scale of a step: each core
keeps its run queue, and the two threads on one core run in turn, a slice each
(a timer tick on a 250 Hz kernel, :func:`tilecast.simulator.ranks_threads.tick_slice_s`).
So one worker (the *sharer*) runs one slice in two while the graph is being
submitted, the others keep their cores, and the submitting thread advances
only in its own slices. Measured on a 2-core KVM guest (Linux 6.18, llama-3x192
at tile 64, two workers, dmda): while the graph was submitted, both workers sat
idle for 2-5 ms at a time with ready tasks queued (dmda had given them to the
worker that was off its core, and the other had nothing), and the submission
took twice its time with one worker (14.6 against 7.5 ms).

What the executor does around it (``tcs_submit`` in ``executor/c/starpu_glue.c``):
the workers are paused between steps and resumed once ``2 x workers`` tasks
are queued. In every traced llama step the woken workers then held both
cores for the rest of a tick (nothing more was submitted for 2-3 ms) before
the submitting thread got its first turn; the tick's phase is unknown, so
that hold lasts half a slice. Short submissions escape it more often:
measured on that guest with gpt2-tiny steps on two workers, submissions of
163 and 264 tasks (0.3-0.5 ms) were rarely cut, those of 1,214 and 2,342
tasks were cut in 8 and 9 runs of 11 (1.6-1.8 ms uncut, 3-11 ms cut), and
one of 13,402 tasks took 52-60 ms, twice its 28 ms with one worker.

The model (:class:`SubmitSlices`): the submitting thread needs ``cpu_task_s``
per task; it runs alone until the workers resume; then every worker is on
its core for ``first_s`` while it waits; then it and the sharer alternate
turns of ``slice_s`` (it first) until the last task is submitted, the other
workers on their cores throughout. A submission that needs at most
``escape_s`` on a core after the resume (half a tick: the tick's phase, at
its median) is not cut (:meth:`SubmitSlices.for_tasks`): the thread keeps
the sharer's core until its last task. Measured on the 2-core KVM guest
(Linux 6.18), submission times of 12 steps per graph with two workers
against one, eager: graphs of 163-300 tasks (0.3-0.5 ms) were cut in 0-4
steps of 12, one of 1,438 tasks (2.1 ms) in 3, one of 2,342 (3.2 ms) in 9,
one of 8,346 (16 ms) in all 12; a cut added 2-5 ms. Charged the hold and
the turns, the 212-task step of a 2-layer 128-wide model at tile 256 was
forecast 14.2 ms on two workers against 11.6 measured (18.5 against 18.6 on
one), its first 2.3 ms without a task on either worker.

A task reaches the scheduler only once submitted. A task that the sharer
begins in the thread's turn starts at its own next turn, and its kernel is
cut by the thread's turns.
:class:`tilecast.simulator.engine.Engine` and the C loop (``c/tcsim.c``) both
apply it, with the same arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class SubmitSlices:
    """The submitting thread and ``workers`` workers on ``workers`` cores (see the module's docstring)."""

    workers: int
    cpu_task_s: float  # the submitting thread's time on a core per task
    slice_s: float  # a turn on a shared core
    first_s: float  # the woken workers' hold of every core after the resume, the submitting thread waiting
    sharer: int = 0  # the worker whose core the submitting thread shares
    escape_s: float = 0.0  # a submission that needs at most this on a core after the resume is not cut (for_tasks)

    def __post_init__(self):
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")
        for name in ("cpu_task_s", "slice_s", "first_s", "escape_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a number of seconds >= 0, got {v!r}")
        if not self.slice_s > 0:
            raise ValueError(f"slice_s must be positive, got {self.slice_s!r}")
        if not 0 <= self.sharer < self.workers:
            raise ValueError(f"sharer must be a worker (0..{self.workers - 1}), got {self.sharer}")

    def for_tasks(self, n_tasks: int) -> "SubmitSlices":
        """The turns of a submission of ``n_tasks``: these, or, where the submitting thread needs at most
        :attr:`escape_s` on a core after the resume, one turn of it from the resume to its last task on the
        sharer's core (the sharer waits for it, the other workers run): a submission that ends before the
        first tick after the resume is not cut (``first_s`` 0, a turn as long as the submission)."""
        after = (n_tasks - min(2 * self.workers, n_tasks)) * self.cpu_task_s
        if after <= 0.0 or after > self.escape_s:
            return self
        return replace(self, first_s=0.0, slice_s=max(self.slice_s, after))

    def resume_at(self, n_tasks: int) -> float:
        """When the workers resume: once ``2 x workers`` tasks (or all of them) are submitted."""
        return min(2 * self.workers, n_tasks) * self.cpu_task_s

    def release_times(self, n_tasks: int) -> np.ndarray:
        """Per task, when the submitting thread has submitted it (the scheduler gets it then)."""
        c, s = self.cpu_task_s, self.slice_s
        k = np.arange(1, n_tasks + 1, dtype=np.float64)
        head = min(2 * self.workers, n_tasks)
        out = k * c  # alone until the workers resume
        if n_tasks > head:
            cpu = (k[head:] - head) * c  # time on a core since the resume
            turns = np.floor(cpu / s)
            left = cpu - turns * s
            at_end = (left == 0.0) & (turns > 0)  # a task ending a turn exactly: in that turn, not the next
            turns[at_end] -= 1
            left[at_end] = s
            out[head:] = self.resume_at(n_tasks) + self.first_s + 2.0 * turns * s + left
        return out

    def run(self, worker: int, begin: float, work: float, resume: float, end: float) -> tuple[float, float]:
        """(start, end) of ``work`` seconds of ``worker`` from ``begin``: off its core before ``resume`` (paused)
        and, the sharer, in the submitting thread's turns before ``end`` (the last task submitted)."""
        t = begin
        if t < resume:
            t = resume
        if worker != self.sharer or t >= end:
            return t, t + work
        first = resume + self.first_s  # the sharer's first turn ends, the submitting thread's begins
        s = self.slice_s
        start = -1.0
        while t < end:
            if t < first:
                turn_end = first
            else:
                k = math.floor((t - first) / s)  # even: the submitting thread's turn; odd: the sharer's
                turn_end = first + (k + 1) * s
                if turn_end <= t:  # t is a turn's end that the division rounded down
                    k += 1
                    turn_end = first + (k + 1) * s
                if k % 2 == 0:
                    t = turn_end if turn_end < end else end
                    continue
            if start < 0.0:
                start = t
            room = turn_end - t
            if work <= room:
                return start, t + work
            work -= room
            t = turn_end
        if start < 0.0:
            start = t
        return start, t + work
