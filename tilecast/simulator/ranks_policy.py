"""Scheduling on several ranks: each rank's own StarPU policy over its own workers, messages on links.

Under StarPU-MPI every rank runs its own StarPU: its scheduler sees only its
workers and the tasks pinned to its rank (the owner-computes rule,
:mod:`tilecast.graph.owner_computes`). :class:`RankPolicy` gives each rank a
policy of its own (any of :data:`tilecast.simulator.simulate.POLICIES`),
attached to a view of the engine restricted to the rank's workers (local
worker ids), and sends every message task to the worker that stands for its
directed link (first come, first served). A task released by a message or by
another rank's task is pushed as from outside the rank's workers (``by = -1``,
as StarPU-MPI's thread pushes it).
"""

from __future__ import annotations

from collections import deque

from tilecast.simulator.policies.base import Policy


class _Busy:
    def __init__(self, engine, workers):
        self.e, self.w = engine, workers

    def __getitem__(self, i):
        return self.e.busy[self.w[i]]


class _Releasing(_Busy):
    def __getitem__(self, i):
        return self.e.releasing[self.w[i]]


class RankView:
    """The engine as one rank's policy sees it: its workers numbered from 0, every task."""

    def __init__(self, engine, workers: list[int]):
        self.e = engine
        self.gw = workers
        self.n_workers = len(workers)
        self.n_tasks = engine.n_tasks
        self.worker_kind = [engine.worker_kind[w] for w in workers]
        self.worker_node = [0] * len(workers)  # one memory node per rank
        self.duration = engine.duration
        self.duration_array = engine.duration_array
        self.env = engine.env
        self.memory = None
        self.missing = engine.missing
        self.busy = _Busy(engine, workers)
        self.releasing = _Releasing(engine, workers)

    @property
    def idle(self) -> set:
        idle = self.e.idle
        return {i for i, w in enumerate(self.gw) if w in idle}

    def wake(self, i: int) -> None:
        self.e.wake(self.gw[i])

    def wake_first_idle(self) -> None:
        """:meth:`Engine.wake_first_idle` among this rank's workers."""
        idle, pushing = self.e.idle, self.e.pushing
        for w in self.gw:
            if w in idle and w != pushing:
                self.e.wake(w)
                return

    def decide(self, locked: int, scanned: int, by: int = -1, serial: bool = True) -> None:
        self.e.decide(locked, scanned, self.gw[by] if by >= 0 else -1, serial)

    def walk(self, by: int, walked: int) -> None:
        """:meth:`Engine.walk` by this rank's worker ``by`` (its global id), or by a thread that is none."""
        self.e.walk(self.gw[by] if by >= 0 else -1, walked)

    def __getattr__(self, name):
        """Anything else a policy reads (the costs the engine charges): the engine's own."""
        return getattr(self.e, name)


class RankPolicy(Policy):
    """Tasks on their rank's policy, messages on their link's queue.

    ``task_rank``: per task, its rank, or -1 for a message; ``task_link``: per
    task, the worker of its link (messages) or -1; ``rank_workers``: per rank,
    its workers' global ids; ``make``: a function returning a fresh policy. A task reaches it once its
    rank's main thread has submitted it (the engine's ``submitted_at``, :mod:`tilecast.simulator.engine`).
    """

    name = "ranks"

    def __init__(self, make, task_rank, task_link, rank_workers):
        self.subs = [make() for _ in rank_workers]
        self.task_rank = list(task_rank)
        self.task_link = list(task_link)
        self.rank_workers = rank_workers

    def attach(self, engine) -> None:
        super().attach(engine)
        self.rank_of_worker = [-1] * engine.n_workers
        self.local = [-1] * engine.n_workers
        for r, ws in enumerate(self.rank_workers):
            for i, w in enumerate(ws):
                self.rank_of_worker[w], self.local[w] = r, i
        self.links = {w: deque() for w in range(engine.n_workers) if self.rank_of_worker[w] < 0}
        for sub, ws in zip(self.subs, self.rank_workers):
            sub.attach(RankView(engine, ws))

    def submit(self) -> None:
        for sub in self.subs:
            sub.submit()

    def push(self, task: int, by: int) -> None:
        link = self.task_link[task]
        if link >= 0:
            self.links[link].append(task)
            self.engine.wake(link)
            return
        r = self.task_rank[task]
        self.subs[r].push(task, self.local[by] if by >= 0 and self.rank_of_worker[by] == r else -1)

    def pop(self, worker: int) -> int:
        r = self.rank_of_worker[worker]
        if r < 0:
            q = self.links[worker]
            return q.popleft() if q else -1
        return self.subs[r].pop(self.local[worker])

    def started(self, task: int, worker: int, begin: float) -> None:
        r = self.rank_of_worker[worker]
        if r >= 0:
            self.subs[r].started(task, self.local[worker], begin)

    def finished(self, task: int, worker: int) -> None:
        r = self.rank_of_worker[worker]
        if r >= 0:
            self.subs[r].finished(task, self.local[worker])
