"""Central-queue policies: ``eager`` and ``prio``.

Following the StarPU handbook (chapter Scheduling, section Task Scheduling
Policy): *eager* keeps one central queue from which every worker draws; a task
with a non-zero priority goes to the front. *prio* keeps one central queue
sorted by priority (higher first; equal priorities in the order they became
ready: StarPU 1.3.10's ``_starpu_priority_push_task``,
src/sched_policies/eager_central_priority_policy.c, pushes at the back of a
``starpu_task_prio_list`` and pops the front of the highest priority,
src/sched_policies/prio_deque.h, ``_starpu_prio_deque_pop_task_for_worker``). Neither knows
where a task will run before a worker takes it, so neither prefetches data.

prio's queue is a red-black tree of priority stages: with searching charged
(``engine.push_walk`` > 0, seconds a tree level), each push costs the pushing
worker, and each pop the popping worker, the tree's height in steps
(:mod:`tilecast.simulator.queue_costs`).
"""

from __future__ import annotations

import heapq
from collections import deque

from tilecast.simulator.policies.base import Policy
from tilecast.simulator.queue_costs import StageCount, priority_stages


class Eager(Policy):
    name = "eager"
    pops_after_pushing = True

    def __init__(self, priority=None):
        self.priority = priority

    def attach(self, engine) -> None:
        super().attach(engine)
        self.queue = deque()
        self.prio = None if self.priority is None else [float(p) != 0.0 for p in self.priority]

    def push(self, task: int, by: int) -> None:
        if self.prio is not None and self.prio[task]:
            self.queue.appendleft(task)
        else:
            self.queue.append(task)
        self.engine.wake_first_idle()

    def pop(self, worker: int) -> int:
        return self.queue.popleft() if self.queue else -1


class Prio(Policy):
    name = "prio"
    pops_after_pushing = True

    def __init__(self, priority):
        self.priority = priority

    def attach(self, engine) -> None:
        super().attach(engine)
        self.heap = []
        self.neg = [-float(p) for p in self.priority]
        self.pushed = 0  # ties in push order
        # the tree's stages, where its search is charged (_starpu_priority_push_task, _starpu_priority_pop_task)
        self.stages = StageCount(priority_stages(self.priority)) if engine.push_walk > 0.0 else None

    def push(self, task: int, by: int) -> None:
        if self.stages is not None:
            self.engine.walk(by, self.stages.add(task))
        self.pushed += 1
        heapq.heappush(self.heap, (self.neg[task], self.pushed, task))
        self.engine.wake_first_idle()

    def pop(self, worker: int) -> int:
        if not self.heap:
            return -1
        t = heapq.heappop(self.heap)[2]
        if self.stages is not None:
            self.engine.walk(worker, self.stages.remove(t))
        return t
