"""The interface between the engine and a scheduling policy.

The engine calls, in this order of a task's life: :meth:`Policy.submit` once
(all tasks, in submission order), :meth:`Policy.push` when a task becomes ready
(all its predecessors ended; ``by`` is the worker that ended the last one, -1
at the start), :meth:`Policy.pop` when a worker is idle (return a task id or
-1), and :meth:`Policy.finished` after a task ends. A policy wakes idle workers
through ``engine.wake(w)``.
"""

from __future__ import annotations


class Policy:
    name = "base"

    def attach(self, engine) -> None:
        self.engine = engine

    def submit(self) -> None:
        """Called once before the run; policies that bind tasks at submission do it here."""

    def push(self, task: int, by: int) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def pop(self, worker: int) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def finished(self, task: int, worker: int) -> None:
        """Called after ``task`` ended on ``worker`` and its successors were pushed."""

    def wake_idle(self) -> None:
        """Offer work to idle workers, lowest id first (deterministic)."""
        eng = self.engine
        busy = eng.busy
        for w in range(eng.n_workers):
            if not busy[w]:
                eng.wake(w)
