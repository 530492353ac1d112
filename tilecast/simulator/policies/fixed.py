"""Fixed assignment, in order: each task is bound to one worker at submission.

The behaviour of CUDA streams (and of StarPU tasks submitted with
``execute_on_a_specific_worker`` and in-order workers): a worker runs the tasks
bound to it one at a time, in submission order; the next one starts when the
worker is free and all of that task's predecessors have ended, even if a later
task of the same worker is already ready.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from tilecast.simulator.policies.base import Policy


class FixedInOrder(Policy):
    name = "fixed"

    def __init__(self, assignment: np.ndarray):
        self.assignment = np.asarray(assignment, dtype=np.int64)

    def attach(self, engine) -> None:
        super().attach(engine)
        a = self.assignment
        if len(a) != engine.n_tasks:
            raise ValueError(f"assignment has {len(a)} entries for {engine.n_tasks} tasks")
        if len(a) and (a.min() < 0 or a.max() >= engine.n_workers):
            raise ValueError(f"assignment names workers outside 0..{engine.n_workers - 1}")

    def submit(self) -> None:
        n_workers = self.engine.n_workers
        order = np.argsort(self.assignment, kind="stable")
        bounds = np.searchsorted(self.assignment[order], np.arange(n_workers + 1))
        self.queues = [deque(order[bounds[w]:bounds[w + 1]].tolist()) for w in range(n_workers)]
        self.owner = self.assignment.tolist()

    def push(self, task: int, by: int) -> None:
        w = self.owner[task]
        q = self.queues[w]
        if q and q[0] == task:
            self.engine.wake(w)

    def pop(self, worker: int) -> int:
        q = self.queues[worker]
        if q and self.engine.missing[q[0]] == 0:
            return q.popleft()
        return -1
