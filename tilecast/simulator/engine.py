"""The discrete-event engine every simulation mode shares.

One :class:`Engine` runs a task DAG on a set of workers under a scheduling
policy, on a simpy clock. It is built for graphs of millions of tasks:

- durations are precomputed per task and per worker kind (numpy, then plain
  lists for fast indexing);
- there is no simpy process per task: a task's end is one simpy timeout event
  whose callback releases successors and asks the policy for the worker's next
  task; transfers are timeline reservations on links (see
  :mod:`tilecast.simulator.memory`), resolved analytically at issue time;
- ties are broken deterministically: simpy processes events scheduled for the
  same instant in scheduling order, and policies choose among equals by
  lowest worker id or earliest submission.

Policies (:mod:`tilecast.simulator.policies`) decide where and when ready tasks
run; the engine only keeps the clock, the worker states and the record.
"""

from __future__ import annotations

from array import array

import numpy as np
import simpy

from tilecast.simulator.dag import successors
from tilecast.simulator.policies.base import Policy
from tilecast.simulator.queue_costs import list_walk_s


class SimulationError(RuntimeError):
    """The simulation cannot proceed (a cycle, a deadlock, a task too big for a memory node)."""


class Engine:
    """Simulate ``n_tasks`` tasks with dependencies on workers.

    Parameters
    ----------
    duration:
        (n_kinds, n_tasks) seconds of execution of each task on each worker kind
        (``inf`` where a kind cannot run a task).
    pred_ptr, pred:
        CSR lists of each task's predecessors (every predecessor has a smaller id).
    worker_kind, worker_node:
        per worker, its kind (row of ``duration``) and memory node.
    policy:
        a :class:`tilecast.simulator.policies.base.Policy`.
    overhead:
        runtime cost per task, in seconds, paid on the worker before the kernel starts.
    decision_scan, decision_lock:
        what a policy's decision costs (dmdasd): seconds per queued task it reads
        (StarPU reads the predicted length of every queued task ahead of the new
        one) and per other worker whose queue it locks to read it. Decisions hold
        the scheduler one at a time, and no task starts while one is in progress:
        ``sched_free`` is when the last decision ends.
    push_walk:
        seconds per step of a search through a sorted queue: a queued task that
        inserting a task walks past (dmdas, dmdasd), a level of prio's tree on
        each push and pop (:meth:`walk`; :mod:`tilecast.simulator.queue_costs`). The worker that pushes pays it before
        its next task, and pops that task only once it has pushed every task its
        ended one released (``pushing``), as a StarPU worker does; meanwhile a
        shared queue's tasks go to the other idle workers (:meth:`wake_first_idle`).
    walk_far, walk_knee:
        a sorted insertion's steps beyond its first ``walk_knee`` cost ``walk_far`` each instead of
        ``push_walk`` (:func:`tilecast.simulator.queue_costs.list_walk_s`; 0: no difference). Only the sorted
        lists' walks get them (dmdas, dmdasd), not prio's tree.
    slices:
        the submitting thread taking its turns on a worker's core
        (:class:`tilecast.simulator.submit_slices.SubmitSlices`, or None): a task reaches the policy only once
        that thread has submitted it, and the worker whose core it shares runs only in its own turns until
        the graph is submitted (where the executor's thread has no core of its own; None: every task is
        with the policy from the start).
    submitted_at:
        without ``slices``, per task the time before which the policy does not get it (the submitting thread
        has not submitted it yet; StarPU-MPI's main threads, :mod:`tilecast.simulator.ranks`), or None.
    gap_before, release:
        per task, seconds charged before it starts beyond ``overhead``, and seconds
        its ending worker spends releasing it before its next task can start (None:
        nothing; :mod:`tilecast.simulator.gap_cost`).
    gap_ready:
        with ``release``: seconds the ending worker spends more per successor its task makes ready.
    gap_handoff:
        seconds charged before a task starts on another worker than the one whose ended task made it ready
        (pushed it to the scheduler): the handoff between cores (:mod:`tilecast.simulator.gap_cost`).
    memory:
        optional :class:`tilecast.simulator.memory.Memory` (data replicas and transfers).
    cache:
        optional :class:`tilecast.simulator.worker_cache.WorkerCache`: a task's duration is then computed
        when it starts, from its worker's cache state, instead of read from ``duration``.
    """

    #: let a policy that has one run the simulation in its fused loop (same results, faster);
    #: tests switch it off to compare with the general loop
    fused_loops = True
    #: let simulate() run the whole simulation in C where the extension is built (same results, far
    #: faster; tilecast/simulator/native.py); tests switch it off to compare the Python loops
    native_loop = True
    #: let simulate() compute each task's cold share per worker when it starts (tilecast/simulator/worker_cache.py)
    #: where the durations come with hot and cold lanes; off: the graph-order durations as given
    worker_cache = True

    def __init__(self, duration, pred_ptr, pred, worker_kind, worker_node, policy,
                 overhead: float = 0.0, memory=None, decision_scan: float = 0.0,
                 decision_lock: float = 0.0,
                 push_walk: float = 0.0, gap_before=None, release=None, gap_ready: float = 0.0,
                 cache=None, gap_handoff: float = 0.0, slices=None, submitted_at=None, walk_far: float = 0.0,
                 walk_knee: float = 0.0):
        duration = np.atleast_2d(np.asarray(duration, dtype=np.float64))
        self.n_tasks = n = duration.shape[1]
        self.n_workers = len(worker_kind)
        if self.n_workers == 0:
            raise SimulationError("no workers to run the tasks on")
        self.duration_array = duration
        self.duration = [row.tolist() for row in duration]
        self.pred_ptr = np.asarray(pred_ptr, dtype=np.int64)
        self.pred = np.asarray(pred, dtype=np.int64)
        succ_ptr, succ = successors(self.pred_ptr, self.pred, n)
        self.succ_ptr = succ_ptr.tolist()
        self.succ = succ.tolist()
        self.missing = np.diff(self.pred_ptr).tolist()
        self.worker_kind = [int(k) for k in worker_kind]
        self.worker_node = [int(m) for m in worker_node]
        self.overhead = float(overhead)
        self.decision_scan = float(decision_scan)
        self.decision_lock = float(decision_lock)
        self.slices = slices
        # per task: when the submitting thread has submitted it (the policy gets it no earlier), or None
        self.submitted_at = None if submitted_at is None else list(submitted_at)
        if slices is not None:
            slices = self.slices = slices.for_tasks(n)
            rel = slices.release_times(n)
            self.submitted_at = rel.tolist()
            self.sub_resume = float(slices.resume_at(n))
            self.sub_end = float(rel[-1]) if n else 0.0
        self.sched_free = 0.0
        self.push_walk = float(push_walk)
        self.walk_far, self.walk_knee = float(walk_far), float(walk_knee)
        self.gap_before = None if gap_before is None else np.asarray(gap_before, dtype=np.float64).tolist()
        self.release = None if release is None else np.asarray(release, dtype=np.float64).tolist()
        self.gap_ready = float(gap_ready)
        self.gap_handoff = float(gap_handoff)
        self.made_by = array("q", [-1]) * n  # the worker whose ended task made each task ready (-1: none)
        self.hold = [0.0] * self.n_workers  # when each worker's sorted insertions end (walk)
        self.pushing = -1  # the worker pushing what its ended task released (push_walk, pops_after_pushing)
        # per worker: releasing its ended task, not yet back in its pop (Policy.pops_after_pushing); 0 or 1
        self.releasing = bytearray(self.n_workers)
        self.memory = memory
        self.cache = cache
        self.policy = policy
        self.env = simpy.Environment()
        self.busy = [False] * self.n_workers
        self.idle = set(range(self.n_workers))
        # flat C arrays: no float object kept per task, and numpy reads them in one copy
        self.start = array("d", bytes(8 * n))
        self.end = array("d", bytes(8 * n))
        self.where = array("q", [-1]) * n
        self.n_done = 0
        policy.attach(self)
        # the policy's start- and end-of-task hooks, skipped when they do nothing
        self._started = policy.started if type(policy).started is not Policy.started else None
        self._finished = policy.finished if type(policy).finished is not Policy.finished else None

    def decide(self, locked: int, scanned: int, by: int = -1, serial: bool = True) -> None:
        """A scheduling decision that locked ``locked`` other workers' queues and read ``scanned`` queued
        tasks: with ``serial`` it holds the scheduler from when the previous decision ends (or now). Made by
        worker ``by`` (releasing the successors of the task it ended; -1: the submitting thread), it also
        runs in that worker's thread after what the thread had to do before (its release, the insertions
        before it): the two add up, as in StarPU, where one thread does them one after the other
        (``_starpu_handle_job_termination``, src/core/jobs.c, pushes each successor through the policy's
        ``push_task``). Without ``serial`` (a decision that reads one sum per worker, under no lock: a
        declared priority range) it is that thread's time only."""
        cost = locked * self.decision_lock + scanned * self.decision_scan
        if cost > 0.0:
            now = self.env._now
            start = now if (now >= self.sched_free or not serial) else self.sched_free
            if by >= 0:
                h = self.hold[by]
                if h > start:
                    start = h
                self.hold[by] = start + cost
            if serial:
                self.sched_free = start + cost

    def walk(self, by: int, walked: int) -> None:
        """Worker ``by`` inserted a task into a sorted queue past ``walked`` queued tasks (or searched ``walked``
        levels of prio's tree, pushing or popping): its next task starts no earlier than when that ends. The thread submitting the graph (``by`` -1) is not a worker: its own
        time per task is measured as a whole (``Machine.submit_task``, :attr:`slices`).

        StarPU 1.3.10: ``_starpu_fifo_push_sorted_task`` (src/sched_policies/fifo_queues.c) walks the
        list from its head past every task of at least the new one's priority, called by
        ``push_task_on_best_worker`` (src/sched_policies/deque_modeling_policy_data_aware.c) in the thread
        that pushes: a worker releasing the successors of the task it ended
        (``_starpu_handle_job_termination``, src/core/jobs.c), before it pops its next task."""
        if by >= 0 and walked:
            h = self.hold[by]
            now = self.env._now
            self.hold[by] = (now if now >= h else h) + list_walk_s(walked, self.push_walk, self.walk_far,
                                                                   self.walk_knee)

    # --- running ------------------------------------------------------------
    def run(self) -> "Engine":
        """Run to completion; raises :class:`SimulationError` if some task never runs."""
        self.policy.submit()
        if not (self.fused_loops and self.submitted_at is None and self.policy.fused_run()):
            push = self.ready_push()
            for t in [i for i, m in enumerate(self.missing) if m == 0]:
                push(t, -1)
            self.env.run()
        if self.n_done != self.n_tasks:
            raise SimulationError(
                f"{self.n_tasks - self.n_done} of {self.n_tasks} tasks never ran "
                f"(policy {self.policy.name!r} left them unscheduled or the dependencies have a cycle)")
        return self

    def wake_first_idle(self) -> None:
        """Offer work to the lowest-numbered idle worker other than the one pushing what its ended task
        released (``pushing``: it pops once it has pushed them all) or still releasing it (``releasing``), if
        any. Offering it to the pushing worker instead would leave every other idle worker idle while a shared
        queue holds tasks."""
        p, releasing = self.pushing, self.releasing
        w = -1
        for i in self.idle:
            if i != p and not releasing[i] and (w < 0 or i < w):
                w = i
        if w >= 0:
            self.wake(w)

    def wake(self, w: int) -> None:
        """Give worker ``w`` its next task if it is idle and the policy has one for it."""
        if self.busy[w] or w == self.pushing or self.releasing[w]:
            return
        t = self.policy.pop(w)
        if t >= 0:
            self._begin(w, t)

    def _begin(self, w: int, t: int) -> None:
        env = self.env
        now = env._now
        begin = now if now >= self.sched_free else self.sched_free
        h = self.hold[w]
        if h > begin:
            begin = h
        begin = begin + self.overhead
        if self.gap_before is not None:
            begin = begin + self.gap_before[t]
        if self.gap_handoff > 0.0:
            by = self.made_by[t]
            if by >= 0 and by != w:
                begin = begin + self.gap_handoff
        if self.memory is not None:
            self.memory.worker = w
            ready = self.memory.acquire(t, self.worker_node[w], now)
            if ready > begin:
                begin = ready
        d = self.duration[self.worker_kind[w]][t] if self.cache is None else self.cache.duration(t, w)
        if self.slices is not None and begin < self.sub_end:
            begin, end = self.slices.run(w, begin, d, self.sub_resume, self.sub_end)
        else:
            end = begin + d
        if self._started is not None:
            self._started(t, w, begin)
        self.busy[w] = True
        self.idle.discard(w)
        self.start[t] = begin
        self.end[t] = end
        self.where[t] = w
        env.timeout(end - now, t).callbacks.append(self._finish)

    def _finish(self, ev) -> None:
        t = ev._value
        w = self.where[t]
        self.busy[w] = False
        self.idle.add(w)
        self.n_done += 1
        if self.memory is not None:
            self.memory.release(t, self.worker_node[w], self.env._now)
        if self._finished is not None:
            self._finished(t, w)
        missing = self.missing
        push = self.ready_push()
        if self.release is not None:  # before its pushes: a worker it wakes for a successor waits for it
            cost = self.release[t]
            if self.gap_ready > 0.0:
                k = 0
                for s in self.succ[self.succ_ptr[t]:self.succ_ptr[t + 1]]:
                    if missing[s] == 1:
                        k += 1
                cost = cost + k * self.gap_ready
            self._released(w, cost)
        after = self.policy.pops_after_pushing
        if after:
            self.releasing[w] = 1
        if self.push_walk > 0.0 or after:
            self.pushing = w
        made_by = self.made_by
        for s in self.succ[self.succ_ptr[t]:self.succ_ptr[t + 1]]:
            missing[s] -= 1
            if missing[s] == 0:
                made_by[s] = w
                push(s, w)
        self.pushing = -1
        if after:
            now = self.env._now
            if self.hold[w] > now:  # it pops once it has released its task: meanwhile another worker may take work
                self.env.timeout(self.hold[w] - now, w).callbacks.append(self._released_all)
                return
        self._pop_next(w)

    def _released_all(self, ev) -> None:
        """Worker ``ev.value`` has released its ended task (:attr:`Policy.pops_after_pushing`): it pops."""
        self._pop_next(ev._value)

    def _pop_next(self, w: int) -> None:
        """Worker ``w``, its ended task released, takes its next task if the policy has one."""
        self.releasing[w] = 0
        if not self.busy[w]:
            nxt = self.policy.pop(w)
            if nxt >= 0:
                self._begin(w, nxt)

    def ready_push(self):
        """What a ready task goes to: the policy's push, or :meth:`_push` where tasks wait to be submitted."""
        return self.policy.push if self.submitted_at is None else self._push

    def _push(self, t: int, by: int) -> None:
        """With ``submitted_at``: give ready task ``t`` to the policy (``by``: the worker whose ended task made it
        ready, -1 none) once the submitting thread has submitted it (then by that thread, -1)."""
        at = self.submitted_at[t]
        now = self.env._now
        if at > now:
            self.env.timeout(at - now, t).callbacks.append(self._submitted)
            return
        self.policy.push(t, by)

    def _submitted(self, ev) -> None:
        self.policy.push(ev._value, -1)

    def _released(self, w: int, cost: float) -> None:
        """Worker ``w`` spends ``cost`` releasing its ended task: its next task starts no earlier than then."""
        if cost > 0.0:
            h = self.hold[w]
            now = self.env._now
            self.hold[w] = (now if now >= h else h) + cost

    # --- results ------------------------------------------------------------
    @property
    def makespan(self) -> float:
        return max(self.end) if self.n_tasks else 0.0

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(start, end, worker) of every task as numpy arrays."""
        return (np.array(self.start, dtype=np.float64), np.array(self.end, dtype=np.float64),
                np.array(self.where, dtype=np.int64))
