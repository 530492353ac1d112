"""Work stealing: ``ws`` and ``lws``, as StarPU 1.3.10 runs them (src/sched_policies/work_stealing_policy.c).

Both keep a queue per worker. A task that becomes ready goes to the queue of
the worker that released it (the one that ended its last predecessor:
``ws_push_task`` takes ``starpu_worker_get_id()``); tasks ready at submission
come from the main thread and go round robin, starting at worker 1
(``select_worker_round_robin``: ``last_push_worker`` starts at 0 and is
advanced before use). A worker takes its own oldest task; an idle worker with
an empty queue steals the *oldest* task of a victim too (``ws_pick_task``:
``_starpu_prio_deque_deque_task_for_worker`` walks the list from its front
like the owner's pop, src/sched_policies/prio_deque.c). Only a worker that
has queued tasks and is busy can be a victim: busy from its pop of a task to
its next pop (``per_worker[w].busy``), so also while it pushes what its ended
task released, which an idle thief then takes first
(:attr:`Policy.pops_after_pushing`).

- *ws* picks the victim round robin (``select_victim_round_robin``; the
  overload-based choice is compiled out, ``USE_OVERLOAD`` undefined): each
  thief scans from where its last scan stopped (``last_pop_worker``) and
  moves past the worker it chose, or by one when it found none.
- *lws* scans its proximity list (``lws_select_victim``, built in
  ``lws_add_workers`` from hwloc's tree by ``starpu_tree_get_neighbour``,
  src/core/tree.c): first its siblings, from the next one round the group
  (w+1, w+2, ... wrapping within the group), then the other groups in the
  same rotation, each from its first worker. The simulator's groups are the
  workers sharing a memory node (on one node: w+1, w+2, ... modulo the
  number of workers, what hwloc gives for cores under one cache or package).
"""

from __future__ import annotations

from collections import deque

from tilecast.simulator.policies.base import Policy


class WorkStealing(Policy):
    name = "ws"
    pops_after_pushing = True

    def attach(self, engine) -> None:
        super().attach(engine)
        n = engine.n_workers
        self.queues = [deque() for _ in range(n)]
        self.last_push = 0  # ws->last_push_worker
        self.last_pop = [0] * n  # per thief, ws->per_worker[w].last_pop_worker

    def push(self, task: int, by: int) -> None:
        eng = self.engine
        if by < 0:  # select_worker_round_robin: advance, then use
            self.last_push = by = (self.last_push + 1) % eng.n_workers
        self.queues[by].append(task)
        if eng.busy[by] or eng.releasing[by]:
            eng.wake_first_idle()  # a thief
        else:
            eng.wake(by)

    def victim(self, worker: int) -> int:
        """select_victim_round_robin: the next worker, from where the last scan stopped, that has
        queued tasks and is busy."""
        queues, busy, releasing, n = self.queues, self.engine.busy, self.engine.releasing, len(self.queues)
        start = v = self.last_pop[worker]
        found = -1
        while True:
            if queues[v] and (busy[v] or releasing[v]):
                found = v
                break
            v = (v + 1) % n
            if v == start:
                break
        self.last_pop[worker] = (v + 1) % n
        return found

    def pop(self, worker: int) -> int:
        q = self.queues[worker]
        if q:
            return q.popleft()
        v = self.victim(worker)
        return self.queues[v].popleft() if v >= 0 else -1


class LocalityWorkStealing(WorkStealing):
    name = "lws"

    def attach(self, engine) -> None:
        super().attach(engine)
        self.proximity = proximity_lists(engine.worker_node)

    def victim(self, worker: int) -> int:
        """lws_select_victim: the first worker of the proximity list that has queued tasks and is busy."""
        queues, busy, releasing = self.queues, self.engine.busy, self.engine.releasing
        for v in self.proximity[worker]:
            if queues[v] and (busy[v] or releasing[v]):
                return v
        return -1


def proximity_lists(worker_node) -> list:
    """Per worker, the others in lws's order (see the module docstring): its group (workers of its
    memory node) rotated from the next one, then the other groups in rotation, each from its first."""
    groups = {}
    for w, node in enumerate(worker_node):
        groups.setdefault(node, []).append(w)
    order = sorted(groups)
    out = []
    for w, node in enumerate(worker_node):
        mine = groups[node]
        i = mine.index(w)
        lst = mine[i + 1:] + mine[:i]
        g = order.index(node)
        for k in range(1, len(order)):
            lst += groups[order[(g + k) % len(order)]]
        out.append(lst)
    return out
