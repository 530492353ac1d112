"""Work stealing: ``ws`` and ``lws``.

Following the StarPU handbook (Task Scheduling Policy): both keep a queue per
worker and put a task on the worker that released it (the one that ended its
last predecessor; initially ready tasks go round robin). An idle worker with an
empty queue steals: under *ws* from the most loaded worker (longest queue,
lowest id on ties), under *lws* from its neighbours, nearest first
(w+1, w+2, ... modulo the number of workers). A worker takes its own oldest
task; a thief takes the victim's newest.
"""

from __future__ import annotations

from collections import deque

from tilecast.simulator.policies.base import Policy


class WorkStealing(Policy):
    name = "ws"

    def attach(self, engine) -> None:
        super().attach(engine)
        self.queues = [deque() for _ in range(engine.n_workers)]
        self.next_rr = 0

    def push(self, task: int, by: int) -> None:
        eng = self.engine
        if by < 0:
            by = self.next_rr
            self.next_rr = (self.next_rr + 1) % eng.n_workers
        self.queues[by].append(task)
        if not eng.busy[by]:
            eng.wake(by)
        elif eng.idle:
            eng.wake(min(eng.idle))

    def victim(self, worker: int) -> int:
        best, best_len = -1, 0
        for v, q in enumerate(self.queues):
            if len(q) > best_len:
                best, best_len = v, len(q)
        return best

    def pop(self, worker: int) -> int:
        q = self.queues[worker]
        if q:
            return q.popleft()
        v = self.victim(worker)
        return self.queues[v].pop() if v >= 0 else -1


class LocalityWorkStealing(WorkStealing):
    name = "lws"

    def victim(self, worker: int) -> int:
        n = len(self.queues)
        for i in range(1, n):
            v = (worker + i) % n
            if self.queues[v]:
                return v
        return -1
