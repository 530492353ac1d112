"""Deque-model policies: ``dm``, ``dmda``, ``dmdas``, ``dmdasd``, as StarPU 1.3.10 runs them.

Every rule below is StarPU 1.3.10's, from src/sched_policies/deque_modeling_policy_data_aware.c
(cited by function beside the code that copies it):

- A task is assigned when it becomes ready. Per worker, StarPU expects the
  task to start at ``max(exp_start, now) + exp_len`` (the worker's expected
  start, moved to now if the worker is late, e.g. its running task overran
  its estimate, plus the predicted work queued), for the data-aware ones no
  earlier than ``now + penalty`` (the time to fetch its missing inputs), and
  to end its predicted length later (``compute_all_performance_predictions``).
- The fitness is ``(end - best end) + beta * penalty`` for dmda/dmdas/dmdasd
  (alpha = beta = 1, energy 0): the transfer counts once in the start and
  once more here; dm's is ``end - best end``. The first worker of least
  fitness wins (``_dmda_push_task``).
- The chosen worker's ``exp_len`` grows by the part of the transfer not
  hidden by its queue and by the predicted length
  (``push_task_on_best_worker``); popping a task removes its transfer,
  starting it removes its length and sets ``exp_start`` to its start plus its
  predicted length (``dmda_pop_task``, ``_starpu_fifo_task_transfer_started``,
  ``dmda_pre_exec_hook``, ``_starpu_fifo_task_started``); its end moves
  ``exp_start`` to ``max(now, exp_start)`` (``dmda_post_exec_hook``,
  ``_starpu_fifo_task_finished``). Both pop and start are applied when the
  simulated worker takes the task (its start is known then).
- The predicted length is StarPU's estimate, not the task's own duration:
  its history-based model's mean per footprint (kernel and buffer sizes),
  given by the caller as ``estimate`` (see :func:`tilecast.simulator.simulate.simulate`);
  by default the durations themselves. StarPU's calibration mode (fewer than
  10 samples of a footprint: greedy placement) is not modelled: the
  executor's warm-up steps fill the history first.
- dmdas and dmdasd keep each worker's queue sorted by priority, equal
  priorities in push order (``_starpu_fifo_push_sorted_task``,
  src/sched_policies/fifo_queues.c). dmdasd also decides with the length of
  only the queued tasks of priority at least the task's
  (``_starpu_fifo_get_exp_len_prev_task_list``); it runs in the general
  loop only. That reading costs time: StarPU locks every worker's queue
  (``starpu_worker_lock``) and asks its history model for the length of
  each queued task ahead of the new one; the decision reports both counts to
  the engine (:meth:`tilecast.simulator.engine.Engine.decide`), which charges
  them at the costs fitted by :mod:`tilecast.loop.decision_cost`. Where the
  context declares a priority range (tilecast declares one for dmdasd:
  :func:`tilecast.graph.priorities.declared_range`), StarPU reads the same
  length as one running sum per worker and priority level
  (``exp_len_per_priority``, ``compute_all_performance_predictions``):
  the decision reads no queued task and takes no other worker's lock, so it
  is the deciding thread's time alone, not one at a time; its fitted cost per
  other worker (``Machine.decision_lock``) stands for the sums' upkeep (each
  push and start adds to or takes from the sums of the levels up to its
  task's, arrays the other worker's thread writes too).

- Inserting into a sorted queue walks the list from its head past every
  queued task of at least the new one's priority (``_starpu_fifo_push_sorted_task``,
  src/sched_policies/fifo_queues.c; none when every queued task has the
  new one's priority), in the thread that pushes, under the queue's lock
  (``push_task_on_best_worker``). The policy reports how many it walked past
  to the engine (:meth:`tilecast.simulator.engine.Engine.walk`), which charges
  the pushing worker ``Machine.push_walk`` seconds for each.

All of them prefetch a task's inputs to the chosen node as soon as it is
assigned.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right, insort
from collections import deque

from tilecast.graph.priorities import reads_queued_tasks
from tilecast.simulator.policies.base import Policy


class DequeModel(Policy):
    name = "dm"
    data_aware = False
    sorted_queues = False
    sorted_decision = False

    def __init__(self, priority=None, estimate=None):
        self.priority = priority
        self.estimate = estimate

    def attach(self, engine) -> None:
        super().attach(engine)
        n = engine.n_workers
        self.exp_start = [0.0] * n  # StarPU's fifo->exp_start
        self.exp_len = [0.0] * n  # predicted work queued, not yet popped (fifo->exp_len)
        self.queues = [[] if self.sorted_queues else deque() for _ in range(n)]
        self.neg = None if self.priority is None else [-float(p) for p in self.priority]
        self.pushed = 0  # sorted queues: equal priorities in push order
        self.scanned = 0  # dmdasd: queued tasks the current decision read
        self.reads_queues = self.sorted_decision and reads_queued_tasks(self.name)  # no declared range
        self.predicted = [0.0] * engine.n_tasks  # task->predicted
        self.predicted_transfer = [0.0] * engine.n_tasks  # task->predicted_transfer
        rows = engine.duration if self.estimate is None else [list(map(float, r)) for r in self.estimate]
        self.rows = rows
        self.workers = [(w, rows[k], node) for w, (k, node) in enumerate(zip(engine.worker_kind, engine.worker_node))]
        self.no_penalty = [0.0] * (max(engine.worker_node) + 1)
        # sorted queues whose insertions are charged: each queue's keys in order, to count the walk
        self.keys = [[] for _ in range(n)] if (self.sorted_queues and engine.push_walk > 0.0) else None

    def _walked(self, w: int, key: float) -> int:
        """How many queued tasks inserting one of sort key ``key`` into ``w``'s queue walks past
        (fifo_queues.c, ``_starpu_fifo_push_sorted_task``): those of at least its priority, none when
        the whole queue has its priority (appended at once); the key is then kept."""
        keys = self.keys[w]
        walked = 0 if not keys or (keys[0] == key and keys[-1] == key) else bisect_right(keys, key)
        insort(keys, key)
        return walked

    def _prev_exp_len(self, w: int, task: int) -> float:
        """dmdasd: predicted work queued ahead of ``task`` on ``w`` (fifo_queues.c,
        ``_starpu_fifo_get_exp_len_prev_task_list``)."""
        q = self.queues[w]
        if not q:
            return 0.0
        neg = self.neg[task] if self.neg else 0.0
        ahead = [e[2] for e in sorted(q) if e[0] <= neg]  # queue order; priority at least the task's
        if not ahead:
            return 0.0
        if len(ahead) == len(q):
            return self.exp_len[w]
        if self.reads_queues:  # StarPU reads each one's predicted length (starpu_task_expected_length)
            self.scanned += len(ahead)
        total = 0.0
        pred = self.predicted
        for t in ahead:
            total += pred[t]
        return total

    def push(self, task: int, by: int) -> None:
        eng = self.engine
        now = eng.env._now
        exp_start, exp_len = self.exp_start, self.exp_len
        memory = eng.memory
        pen = memory.penalty(task) if (self.data_aware and memory is not None) else self.no_penalty
        da = self.data_aware
        # compute_all_performance_predictions: each worker's expected end of the task
        ends = []
        best_end = float("inf")
        self.scanned = 0
        for w, row, node in self.workers:
            es = exp_start[w]
            if es < now:  # "Sometimes workers didn't take the tasks as early as we expected"
                es = now
            start = es + (self._prev_exp_len(w, task) if self.sorted_decision else exp_len[w])
            if da:
                a = now + pen[node]
                if a > start:
                    start = a
            e = start + row[task]
            ends.append(e)
            if e < best_end:
                best_end = e
        # _dmda_push_task: fitness = alpha (end - best end) + beta penalty (+ gamma energy, 0 here)
        best_w, best_f = -1, 0.0
        for w, row, node in self.workers:
            f = ends[w] - best_end
            if da:
                f = f + pen[node]
            if best_w == -1 or f < best_f:
                best_w, best_f = w, f
        w = best_w
        if w < 0 or not ends[w] < float("inf"):
            raise RuntimeError(f"task {task}: no worker can run it")
        _, row, node = self.workers[w]
        # push_task_on_best_worker
        es = exp_start[w]
        if es < now:
            es = now
        exp_start[w] = es
        qend = es + exp_len[w]
        a = now + pen[node]
        tr = 0.0 if a < qend else a - qend
        exp_len[w] += tr
        exp_len[w] += row[task]
        self.predicted[task] = row[task]
        self.predicted_transfer[task] = tr
        q = self.queues[w]
        if memory is not None and (q or eng.busy[w]):  # an idle worker fetches at once anyway
            memory.prefetch(task, node, now)
        if self.sorted_decision:  # reading the queues, it locked every worker's queue but the deciding worker's
            # own (with a declared range: none); the decision comes before the insertion
            # (compute_all_performance_predictions, then push_task_on_best_worker)
            eng.decide(eng.n_workers - (1 if by >= 0 else 0), self.scanned, by, self.reads_queues)
        if self.sorted_queues:
            self.pushed += 1
            key = self.neg[task] if self.neg else 0.0
            heapq.heappush(q, (key, self.pushed, task))
            if self.keys is not None:
                eng.walk(by, self._walked(w, key))
        else:
            q.append(task)
        if not eng.busy[w]:
            eng.wake(w)

    def fused_run(self) -> bool:
        from tilecast.simulator.compiled import fused_loop_module
        from tilecast.simulator.memory import Memory

        if self.sorted_decision or (self.engine.memory is not None and type(self.engine.memory) is not Memory):
            return False
        fused_loop_module().run_deque_model(self.engine)
        return True

    def pop(self, worker: int) -> int:
        q = self.queues[worker]
        if not q:
            return -1
        if self.keys is not None:
            del self.keys[worker][0]
        return heapq.heappop(q)[2] if self.sorted_queues else q.popleft()

    def started(self, task: int, worker: int, begin: float) -> None:
        # dmda_pop_task + _starpu_fifo_task_transfer_started, then dmda_pre_exec_hook +
        # _starpu_fifo_task_started at the kernel's start: exp_start = begin + predicted
        left = self.exp_len[worker] - self.predicted_transfer[task]
        self.exp_len[worker] = left - self.predicted[task]
        self.exp_start[worker] = begin + self.predicted[task]

    def finished(self, task: int, worker: int) -> None:
        # dmda_post_exec_hook / _starpu_fifo_task_finished: exp_start = max(now + pipeline (0), exp_start)
        now = self.engine.env._now
        if self.exp_start[worker] < now:
            self.exp_start[worker] = now


class DequeModelDataAware(DequeModel):
    name = "dmda"
    data_aware = True


class DequeModelDataAwareSorted(DequeModel):
    name = "dmdas"
    data_aware = True
    sorted_queues = True


class DequeModelDataAwareSortedDecision(DequeModelDataAwareSorted):
    name = "dmdasd"
    sorted_decision = True
