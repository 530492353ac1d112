"""What a push or a pop costs each policy as StarPU 1.3.10 runs it, and on what state it depends.

Every policy's push and pop cost some constant time; that constant, at a
given worker count, is part of the runtime's cost per task measured per
policy and worker count on the probe steps (``Machine.task_overhead``,
:mod:`tilecast.loop.host_cost`). What the simulator charges apart is what
grows with the state of the queues, where a constant fitted on small probes
would be wrong on a large step. :data:`RULES` states, per policy, what its
push and its pop walk through in StarPU 1.3.10 (Debian's
``starpu-1.3.10+dfsg`` sources) and how the simulator charges it.

The charges that depend on state are all "steps of a search through a
queue", paid by the thread that walks, before that worker's next task
(:meth:`tilecast.simulator.engine.Engine.walk`), at ``Machine.push_walk``
seconds a step, per policy and worker count:

- dmdas, dmdasd: a task walked past in a worker's sorted list, fitted at
  calibration beside the same policy without the search
  (:mod:`tilecast.loop.decision_cost`), bounded by its cost measured on a
  queue of known length;
- prio: a level of the red-black tree of priority stages, measured on
  StarPU on queues of known length (:func:`tilecast.loop.queue_probe.measure`,
  :func:`tilecast.loop.host_cost.set_measured_tree`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Rule:
    push: str  # what a push walks through, as a function of the state
    pop: str
    source: str  # StarPU 1.3.10 file and function
    charged: str  # how the simulator charges what grows with the state


RULES = {
    "eager": Rule("O(1): appended to the central FIFO", "O(1) on CPU-only workers: the first task any worker "
                  "can run", "src/sched_policies/eager_central_policy.c: push_task_eager_policy, "
                  "pop_task_eager_policy; fifo_queues.c: _starpu_fifo_pop_task",
                  "constant: the runtime's cost per task (task_overhead)"),
    "prio": Rule("O(log B), B the distinct priorities queued: a red-black tree lookup of the task's priority "
                 "stage, a stage allocated when new", "O(log B): the tree's first non-empty stage, then the "
                 "task's erase looks its stage up again and frees it when empty",
                 "src/sched_policies/eager_central_priority_policy.c: _starpu_priority_push_task, "
                 "_starpu_priority_pop_task; prio_deque.c: _starpu_prio_deque_pop_task_for_worker; "
                 "src/common/prio_list.h: prio_list_add, prio_list_erase, prio_list_get_first_nonempty_stage",
                 "tree_levels(B) steps on each push (the pushing worker) and each pop (the popping worker)"),
    "random": Rule("O(workers): the speeds of all workers summed to draw one", "O(1): the worker's FIFO",
                   "src/sched_policies/random_policy.c: _random_push_task",
                   "constant at a given worker count: task_overhead per policy and worker count"),
    "ws": Rule("O(1): the releasing worker's deque (a prio list whose tasks all have priority 0: one stage, "
               "never freed)", "O(workers) at most: victims tried round robin among busy workers, the oldest "
               "task taken", "src/sched_policies/work_stealing_policy.c: ws_push_task, ws_pop_task, "
               "select_victim_round_robin", "constant at a given worker count"),
    "lws": Rule("O(1): the releasing worker's deque", "O(workers) at most: victims in proximity order",
                "src/sched_policies/work_stealing_policy.c: lws_select_victim", "constant at a given worker count"),
    "dm": Rule("O(workers): every worker's expected end computed (fitness loop)", "O(1): the worker's FIFO",
               "src/sched_policies/deque_modeling_policy_data_aware.c: _dm_push_task",
               "constant at a given worker count"),
    "dmda": Rule("O(workers x buffers): each worker's expected end and data penalty", "O(1)",
                 "deque_modeling_policy_data_aware.c: compute_all_performance_predictions, _dmda_push_task",
                 "constant at a given worker count"),
    "dmdas": Rule("dmda's, then O(queue): the chosen worker's list walked from its head past every task of at "
                  "least the new one's priority", "O(1): the list's head",
                  "src/sched_policies/fifo_queues.c: _starpu_fifo_push_sorted_task",
                  "a step per task walked past, paid by the pushing worker (Engine.walk), dearer past the "
                  "list's head (list_walk_s)"),
    "dmdasd": Rule("dmdas's, and O(sum of queues): every worker's queued tasks ahead of the new one read under "
                   "its lock", "O(1)", "fifo_queues.c: _starpu_fifo_get_exp_len_prev_task_list",
                   "the walk, and each decision on one serial scheduler (Engine.decide)"),
}

def list_walk_s(walked: int, near: float, far: float = 0.0, knee: float = 0.0) -> float:
    """Seconds a sorted insertion that walks past ``walked`` queued tasks costs: ``near`` a step over the first
    ``knee`` steps, ``far`` a step beyond them (``far`` 0: ``near`` for every step).

    Why two costs: each step reads the next task's priority and its ``next`` pointer (two cache lines of a
    448-byte ``struct starpu_task``, StarPU 1.3.10), a chain of dependent loads. Every insertion walks from
    the list's head, so the head stays in the core's first-level cache; deeper tasks come from further out,
    at a latency the prefetchers cannot hide when the list's order is not the order the tasks lie in memory,
    as in a step's ready queue sorted by priority. Measured on StarPU by
    :func:`tilecast.loop.queue_probe.measure_sorted` (2-core Intel Xeon guest, one worker, priorities in
    random order: 2.7 ns a step over the first 206, 7.6 beyond; 2.0-2.7 ns a step at any length when the
    priorities follow the tasks' order in memory)."""
    if far <= 0.0 or walked <= knee:
        return walked * near
    return knee * near + (walked - knee) * far


#: policies whose search is a walk along a sorted list (list_walk_s), not a tree
SORTED_LISTS = ("dmdas", "dmdasd")


def walk_far_of(machine, sched: str) -> tuple[float, float]:
    """(far cost per step, knee) of ``sched``'s insertions on ``machine``: the machine's for a sorted list's
    walk, (0, 0) for every other policy."""
    if sched in SORTED_LISTS:
        return float(machine.push_walk_far), float(machine.push_walk_knee)
    return 0.0, 0.0


#: policies whose search through a queue the simulator charges (Machine.push_walk a step; Engine.walk)
SEARCHING = ("prio", "dmdas", "dmdasd")


def tree_levels(stages: int) -> int:
    """Steps of a search in a balanced binary tree of ``stages`` nodes: its height, floor(log2) + 1 (0 when
    empty). The same integer in the C loop (tcsim.c, ``tree_levels``)."""
    return int(stages).bit_length()


def priority_stages(priority) -> np.ndarray:
    """Each task's stage of prio's tree: the dense rank of its priority (tasks of equal priority share one
    stage, a list in push order, as ``starpu_task_prio_list`` keeps them)."""
    p = np.asarray(priority, dtype=np.float64)
    return np.unique(p, return_inverse=True)[1].astype(np.int32).reshape(-1)


class StageCount:
    """The distinct priorities queued in prio's tree, kept as tasks are pushed and popped."""

    def __init__(self, stage):
        self.stage = [int(s) for s in stage]
        self.count = [0] * (max(self.stage, default=-1) + 1)
        self.stages = 0

    def add(self, task: int) -> int:
        """Tree steps of pushing ``task`` (the search before its stage is added)."""
        levels = tree_levels(self.stages)
        s = self.stage[task]
        if self.count[s] == 0:
            self.stages += 1
        self.count[s] += 1
        return levels

    def remove(self, task: int) -> int:
        """Tree steps of popping ``task`` (the search with its stage still in the tree)."""
        levels = tree_levels(self.stages)
        s = self.stage[task]
        self.count[s] -= 1
        if self.count[s] == 0:
            self.stages -= 1
        return levels
