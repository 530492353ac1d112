"""The interface between the engine and a scheduling policy.

The engine calls, in this order of a task's life: :meth:`Policy.submit` once
(all tasks, in submission order), :meth:`Policy.push` when a task becomes ready
(all its predecessors ended; ``by`` is the worker that ended the last one, -1
at the start), :meth:`Policy.pop` when a worker is idle (return a task id or
-1), :meth:`Policy.started` once the popped task's start is known, and
:meth:`Policy.finished` when a task ends, before its successors are pushed. A policy wakes idle workers
through ``engine.wake(w)``.
"""

from __future__ import annotations

import numpy as np


class Policy:
    name = "base"
    #: whether a worker whose task ended pushes every task it released before it pops its next one, so that an
    #: idle worker takes the first of them: StarPU's driver pushes them from ``_starpu_handle_job_termination``
    #: (``_starpu_notify_dependencies``, src/core/jobs.c) and only then calls the policy's pop, while an idle
    #: worker is already spinning in its pop (``STARPU_NON_BLOCKING_DRIVERS``). It decides where a task runs
    #: only in the policies whose workers race for it in their pops (a central queue, stealing); in traces of
    #: gpt2-4x512 at tile 512 on two workers, a task that an ended one alone made ready while the other worker
    #: idled ran on that other worker 80% of the time under eager, 93% under ws and 90% under lws and prio.
    pops_after_pushing = False

    def attach(self, engine) -> None:
        self.engine = engine

    def submit(self) -> None:
        """Called once before the run; policies that bind tasks at submission do it here."""

    def fused_run(self) -> bool:
        """Run the whole simulation in a loop specialised for this policy, if it has one.

        Returns False where it has none (the engine then runs its general loop).
        A fused loop must give exactly the general loop's results.
        """
        return False

    def push(self, task: int, by: int) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def pop(self, worker: int) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def started(self, task: int, worker: int, begin: float) -> None:
        """Called when ``worker`` took ``task``, whose kernel starts at ``begin`` (after its data arrived)."""

    def finished(self, task: int, worker: int) -> None:
        """Called when ``task`` ended on ``worker``, before its successors are pushed."""

    def wake_idle(self) -> None:
        """Offer work to the lowest-numbered idle worker, if any (deterministic; not the pushing one)."""
        self.engine.wake_first_idle()


def speed_weights(engine) -> np.ndarray:
    """Relative speed of each worker: total work on the slowest kind / total work on its kind."""
    return kind_speed_weights(engine.duration_array, engine.worker_kind)


def kind_speed_weights(duration: np.ndarray, worker_kind) -> np.ndarray:
    """:func:`speed_weights` from the (kinds x tasks) durations and each worker's kind."""
    total = np.array([np.sum(row[np.isfinite(row)]) for row in np.atleast_2d(duration)])
    total[total <= 0] = 1.0
    per_kind = total.max() / total
    return per_kind[np.asarray(worker_kind)]
