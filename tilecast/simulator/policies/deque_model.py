"""Deque-model policies: ``dm``, ``dmda``, ``dmdas``.

Following the StarPU handbook (Task Scheduling Policy): a task is assigned when
it becomes ready to the worker where it is expected to *complete* first,
given the worker's queued work and the task's modelled duration on that
worker's kind (a HEFT-like rule). *dmda* also counts the time to move the
task's missing input data to the worker's memory node (fitness = expected
end + data penalty, StarPU's alpha = beta = 1); *dmdas* is dmda with each
worker's queue sorted by priority. All three prefetch a task's inputs to the
chosen node as soon as it is assigned. Ties go to the lowest worker id.

A worker's expected end is tracked as StarPU does: ``exp_start`` (moved to
now when the worker finishes a task) plus ``exp_len`` (predicted work queued),
kept here as their sum ``exp_end``.
"""

from __future__ import annotations

import heapq
from collections import deque

from tilecast.simulator.policies.base import Policy


class DequeModel(Policy):
    name = "dm"
    data_aware = False
    sorted_queues = False

    def __init__(self, priority=None):
        self.priority = priority

    def attach(self, engine) -> None:
        super().attach(engine)
        n = engine.n_workers
        self.exp_end = [0.0] * n  # exp_start + exp_len
        self.exp_len = [0.0] * n
        self.queues = [[] if self.sorted_queues else deque() for _ in range(n)]
        self.neg = None if self.priority is None else [-float(p) for p in self.priority]
        self.assigned_len = [0.0] * engine.n_tasks
        rows = engine.duration
        self.workers = [(w, rows[k], node) for w, (k, node) in enumerate(zip(engine.worker_kind, engine.worker_node))]
        self.no_penalty = [0.0] * (max(engine.worker_node) + 1)

    def push(self, task: int, by: int) -> None:
        eng = self.engine
        now = eng.env._now
        exp_end = self.exp_end
        memory = eng.memory
        pen = memory.penalty(task) if (self.data_aware and memory is not None) else self.no_penalty
        best_w, best_f = -1, float("inf")
        for w, row, node in self.workers:
            e = exp_end[w]
            if e < now:
                e = now
            f = e + row[task] + pen[node]
            if f < best_f:
                best_w, best_f = w, f
        w = best_w
        if w < 0:
            raise RuntimeError(f"task {task}: no worker can run it")
        _, row, node = self.workers[w]
        e = exp_end[w]
        if e < now:
            e = now
        # the worker cannot start before the data arrives
        arrival = now + pen[node]
        length = row[task] + eng.overhead + (arrival - e if arrival > e else 0.0)
        exp_end[w] = e + length
        self.exp_len[w] += length
        self.assigned_len[task] = length
        q = self.queues[w]
        if memory is not None and (q or eng.busy[w]):  # an idle worker fetches at once anyway
            memory.prefetch(task, node, now)
        if self.sorted_queues:
            heapq.heappush(q, (self.neg[task] if self.neg else 0.0, task))
        else:
            q.append(task)
        if not eng.busy[w]:
            eng.wake(w)

    def fused_run(self) -> bool:
        from tilecast.simulator.compiled import fused_loop_module
        from tilecast.simulator.memory import Memory

        if self.engine.memory is not None and type(self.engine.memory) is not Memory:
            return False
        fused_loop_module().run_deque_model(self.engine)
        return True

    def pop(self, worker: int) -> int:
        q = self.queues[worker]
        if not q:
            return -1
        return heapq.heappop(q)[1] if self.sorted_queues else q.popleft()

    def finished(self, task: int, worker: int) -> None:
        left = self.exp_len[worker] - self.assigned_len[task]
        if left < 1e-15:
            left = 0.0
        self.exp_len[worker] = left
        self.exp_end[worker] = self.engine.env._now + left


class DequeModelDataAware(DequeModel):
    name = "dmda"
    data_aware = True


class DequeModelDataAwareSorted(DequeModel):
    name = "dmdas"
    data_aware = True
    sorted_queues = True
