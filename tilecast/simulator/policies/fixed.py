"""Fixed assignment, in order: each task is bound to one worker at submission.

The behaviour of CUDA streams (and of StarPU tasks submitted with
``execute_on_a_specific_worker`` and in-order workers): a worker runs the tasks
bound to it one at a time, in submission order; the next one starts when the
worker is free and all of that task's predecessors have ended, even if a later
task of the same worker is already ready.
"""

from __future__ import annotations

from array import array
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

    def fused_run(self) -> bool:
        """The general loop's times in one pass in submission order, where nothing but the order and the
        dependencies delays a task (no overhead, memory, worker cache or scheduling costs).

        A task then starts at the later of two events: its worker's previous task ending and its last
        predecessor ending. An ending is an event on the simpy clock at ``begin + (end - begin)``, as
        :meth:`Engine._begin` schedules it, so that is the time a successor sees, bit for bit.
        """
        eng = self.engine
        if (eng.memory is not None or eng.cache is not None or eng.overhead or eng.decision_scan
                or eng.decision_lock or eng.push_walk or eng.gap_before is not None
                or eng.release is not None or eng.gap_handoff
                or not np.isfinite(eng.duration_array[list(set(eng.worker_kind))]).all()):
            return False  # the general loop charges these (and meets an unending task as it does)
        n = eng.n_tasks
        kind, owner = eng.worker_kind, self.owner
        duration = [eng.duration[kind[w]] for w in range(eng.n_workers)]
        ptr, pred = eng.pred_ptr.tolist(), eng.pred.tolist()
        free = [0.0] * eng.n_workers  # when each worker's last task ended (the clock's event)
        ended = [0.0] * n  # the same, per task
        start, end = [0.0] * n, [0.0] * n
        for t in range(n):
            w = owner[t]
            begin = free[w]
            for p in pred[ptr[t]:ptr[t + 1]]:
                if ended[p] > begin:
                    begin = ended[p]
            e = begin + duration[w][t]
            start[t] = begin
            end[t] = e
            free[w] = ended[t] = begin + (e - begin)
        eng.start, eng.end = array("d", start), array("d", end)
        eng.where = array("q", owner)
        eng.n_done = n
        return True

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
