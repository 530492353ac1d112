"""``random``: a queue per worker; each task goes to a worker drawn at random,
weighted by the worker's assumed overall speed (StarPU handbook, Task
Scheduling Policy). Draws come from a seeded generator, one per task, so runs
are reproducible.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from tilecast.simulator.policies.base import Policy, speed_weights


class Random(Policy):
    name = "random"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def attach(self, engine) -> None:
        super().attach(engine)
        w = speed_weights(engine)
        cdf = np.cumsum(w / w.sum())
        draws = np.random.default_rng(self.seed).random(engine.n_tasks)
        self.choice = np.minimum(np.searchsorted(cdf, draws, side="right"), engine.n_workers - 1).tolist()
        self.queues = [deque() for _ in range(engine.n_workers)]

    def push(self, task: int, by: int) -> None:
        w = self.choice[task]
        self.queues[w].append(task)
        self.engine.wake(w)

    def pop(self, worker: int) -> int:
        q = self.queues[worker]
        return q.popleft() if q else -1
