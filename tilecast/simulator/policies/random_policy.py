"""``random``: a queue per worker; each task goes to a worker drawn at random,
weighted by the worker's assumed overall speed (StarPU handbook, Task
Scheduling Policy). Draws come from a seeded generator, one per task, so runs
are reproducible.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from tilecast.simulator.policies.base import Policy, kind_speed_weights


class Random(Policy):
    name = "random"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def attach(self, engine) -> None:
        super().attach(engine)
        self.choice = draw_workers(engine.duration_array, engine.worker_kind, engine.n_tasks, self.seed).tolist()
        self.queues = [deque() for _ in range(engine.n_workers)]

    def push(self, task: int, by: int) -> None:
        w = self.choice[task]
        self.queues[w].append(task)
        self.engine.wake(w)

    def pop(self, worker: int) -> int:
        q = self.queues[worker]
        return q.popleft() if q else -1


def draw_workers(duration: np.ndarray, worker_kind, n_tasks: int, seed: int = 0) -> np.ndarray:
    """Each task's worker, drawn with the seeded generator, weighted by the workers' speeds."""
    w = kind_speed_weights(duration, worker_kind)
    cdf = np.cumsum(w / w.sum())
    draws = np.random.default_rng(seed).random(n_tasks)
    return np.minimum(np.searchsorted(cdf, draws, side="right"), len(worker_kind) - 1)
