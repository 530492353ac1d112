"""Simulate a task graph on a machine under a StarPU scheduling policy.

:func:`simulate` is the entry point: durations come from
:class:`tilecast.perfmodel.kernel_model.DurationModel` (vectorised over the
graph), then the :class:`~tilecast.simulator.engine.Engine` runs the tasks with
the policy, the data replicas (:mod:`~tilecast.simulator.memory`) and the link
timelines (:mod:`~tilecast.simulator.links`). The result carries a trace in
the common schema (``source='sim'``) and a summary.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pandas is imported where a trace is made (0.4 s): predictions need none
    import pandas as pd

from tilecast.kernels import all_kernels
from tilecast.graph.analysis import longest_path_end
from tilecast.graph import priorities as _prio
from tilecast.simulator import gap_cost, native
from tilecast.simulator.engine import Engine
from tilecast.simulator.worker_cache import WorkerCache, native_inputs
from tilecast.simulator.links import Links
from tilecast.simulator.valid_durations import check_durations
from tilecast.simulator.memory import Memory
from tilecast.simulator.policies.central import Eager, Prio
from tilecast.simulator.policies.deque_model import (DequeModel, DequeModelDataAware, DequeModelDataAwareSorted,
                                                     DequeModelDataAwareSortedDecision)
from tilecast.simulator.policies.random_policy import Random, draw_workers
from tilecast.simulator.queue_costs import SEARCHING, walk_far_of
from tilecast.simulator.policies.stealing import LocalityWorkStealing, WorkStealing, proximity_lists
from tilecast.trace import make_trace

POLICIES = {  # name -> (priority, seed, estimate) -> policy
    "eager": lambda prio, seed, est: Eager(prio),
    "prio": lambda prio, seed, est: Prio(prio),
    "random": lambda prio, seed, est: Random(seed),
    "ws": lambda prio, seed, est: WorkStealing(),
    "lws": lambda prio, seed, est: LocalityWorkStealing(),
    "dm": lambda prio, seed, est: DequeModel(prio, est),
    "dmda": lambda prio, seed, est: DequeModelDataAware(prio, est),
    "dmdas": lambda prio, seed, est: DequeModelDataAwareSorted(prio, est),
    "dmdasd": lambda prio, seed, est: DequeModelDataAwareSortedDecision(prio, est),
}
#: policies that decide with StarPU's performance-model estimates (per-footprint means), not exact durations
USES_ESTIMATES = ("dm", "dmda", "dmdas", "dmdasd")
USES_PRIORITIES = _prio.USES_PRIORITIES


@dataclass
class SimResult:
    start: np.ndarray
    end: np.ndarray
    worker: np.ndarray
    summary: dict
    transfers: dict  # src, dst, bytes, start, end arrays
    graph: object
    machine: object

    @property
    def makespan(self) -> float:
        return self.summary["makespan_s"]

    def trace(self) -> pd.DataFrame:
        """The simulated trace: one row per task, then one per transfer (common schema)."""
        g, m = self.graph, self.machine
        names = np.array([k.name for k in all_kernels()], dtype=object)
        tags = np.array(g.tags, dtype=object)
        node = np.array([w.node for w in m.workers], dtype=np.int64)[self.worker]
        tr = self.transfers
        first = np.array([[(m.routes[s][d] or [-1])[0] if s != d else -1 for d in range(len(m.nodes))]
                          for s in range(len(m.nodes))], dtype=np.int64).reshape(len(m.nodes), -1)
        n_t = len(tr["bytes"])
        return make_trace(
            task=np.concatenate([np.arange(g.n_tasks, dtype=np.int64), np.full(n_t, -1, np.int64)]),
            kernel=np.concatenate([names[g.kernel], np.full(n_t, "transfer", dtype=object)]),
            worker=np.concatenate([self.worker, first[tr["src"], tr["dst"]] if n_t else np.zeros(0, np.int64)]),
            node=np.concatenate([node, tr["dst"]]),
            start_s=np.concatenate([self.start, tr["start"]]),
            end_s=np.concatenate([self.end, tr["end"]]),
            bytes=np.concatenate([g.bytes.astype(np.int64), tr["bytes"]]),
            flops=np.concatenate([g.flops, np.zeros(n_t)]),
            source="sim",
            tag=np.concatenate([tags[g.tag], np.full(n_t, "", dtype=object)]),
        )


def task_priorities(durations: np.ndarray, pred_ptr, pred, sched: str = "prio") -> np.ndarray:
    """Default priorities: each task's bottom level (longest path to the end) on its fastest kind,
    as the int priorities StarPU policy ``sched`` is given by the executor.

    The graph carries no priorities; the critical-path-first order is what
    StarPU users usually give ``prio``/``dmdas``. One definition,
    :func:`tilecast.graph.priorities.task_priorities`, serves the executor too.
    """
    weights = np.atleast_2d(durations).min(axis=0)
    levels = native.bottom_level(weights, pred_ptr, pred)  # the same levels, in C where it is built
    if levels is None:
        return _prio.task_priorities(weights, pred_ptr, pred, sched)
    return _prio.starpu_priorities(levels, *_prio.priority_range(sched))


def simulate(graph, machine, sched: str = "dmda", durations: np.ndarray | None = None, calibration=None,
             priority: np.ndarray | None = None, transfers: bool = True, seed: int = 0) -> SimResult:
    """Simulate ``graph`` on ``machine`` with StarPU policy ``sched``.

    durations: optional (n_kinds, n_tasks) seconds (rows in ``machine.kind_names``
    order); by default from the duration model with ``calibration``.
    priority: optional per-task priorities (higher first); by default the
    bottom levels as StarPU priorities for ``prio``, ``dmdas`` and ``dmdasd``
    (the ones the executor passes), none otherwise.
    The dm family (``USES_ESTIMATES``) decides with the mean duration of each
    task's footprint (StarPU's history-based estimate); tasks run their own.
    Durations from :class:`~tilecast.perfmodel.kernel_model.DurationModel` carry hot
    and cold lane times: each task's then takes its worker's cache state into account
    when it starts (:mod:`tilecast.simulator.worker_cache`); priorities, the dm
    family's estimates and the summary's bounds keep the graph-order durations.
    transfers: model data replicas and transfers (False: data is everywhere).
    Durations NaN, negative, or inf for a task on every kind the machine's workers have raise
    :class:`~tilecast.errors.FieldError` ("durations: ..."), and so does inf on some kind under a policy
    other than the dm family, which alone chooses among the kinds that can run a task
    (:mod:`tilecast.simulator.valid_durations`).
    """
    if sched not in POLICIES:
        raise ValueError(f"unknown scheduling policy {sched!r} (known: {', '.join(POLICIES)})")
    # A simulation allocates millions of short-lived containers and keeps no garbage cycles
    # worth collecting on the way: the cyclic collector's passes would only cost time (5-10% of
    # a gpt2-xl step). Reference counting frees everything as usual; collection resumes after.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _simulate(graph, machine, sched, durations, calibration, priority, transfers, seed)
    finally:
        if collecting:
            gc.enable()


def _simulate(graph, machine, sched, durations, calibration, priority, transfers, seed) -> SimResult:
    if durations is None:
        from tilecast.perfmodel.kernel_model import DurationModel
        durations = DurationModel(machine, calibration).durations(graph)
    lanes = worker_lanes(durations)
    durations = np.atleast_2d(np.asarray(durations, dtype=np.float64))
    n_kinds = len(machine.kind_names)
    if durations.ndim != 2 or durations.shape[1] != graph.n_tasks or durations.shape[0] not in (1, n_kinds):
        raise ValueError(f"durations: shape {durations.shape}, expected (worker kinds, tasks) = "
                         f"({n_kinds}, {graph.n_tasks})")
    kind_index = {k: i for i, k in enumerate(machine.kind_names)}
    worker_kind = [kind_index[w.kind] for w in machine.workers]
    check_durations(durations, machine.kind_names, worker_kind, sched)  # NaN, or a task no worker can run: refused
    pred_ptr, pred = graph.dependencies
    if priority is None and sched in USES_PRIORITIES:
        priority = task_priorities(durations + machine.task_overhead, pred_ptr, pred, sched)
    worker_node = [w.node for w in machine.workers]
    links = Links(machine)
    memory = None
    # the dm family decides with what StarPU's history-based models predict: the mean duration of the
    # task's footprint (kernel and buffer sizes), not the task's own (tilecast.graph.priorities)
    estimate = _prio.footprint_means(durations, _prio.footprint_groups(graph)) if sched in USES_ESTIMATES else None
    if Engine.fused_loops and Engine.native_loop and native.supports(sched, machine):
        # the same simulation in C (tilecast/simulator/native.py): equal results, far faster
        choice = draw_workers(durations, worker_kind, graph.n_tasks, seed) if sched == "random" else None
        proximity = proximity_lists(worker_node) if sched == "lws" else None
        cache = native_inputs(lanes, graph, worker_kind) if lanes is not None else None
        run = native.run(graph, machine, sched, durations, estimate, priority, choice, proximity, transfers,
                         gap_charges=gap_cost.charges(graph, machine), cache=cache)
        start, end, worker, tr = run.start, run.end, run.worker, run.transfers
        memory = run.memory
    else:
        memory = Memory(graph, machine, links) if transfers and len(machine.nodes) > 1 else None
        policy = POLICIES[sched](priority, seed, estimate)
        walk_far, walk_knee = walk_far_of(machine, sched)
        eng = Engine(durations, pred_ptr, pred, worker_kind, worker_node, policy,
                     overhead=machine.task_overhead, memory=memory, decision_scan=machine.decision_scan,
                     decision_lock=machine.decision_lock,
                     push_walk=machine.push_walk if sched in SEARCHING else 0.0,
                     walk_far=walk_far, walk_knee=walk_knee,
                     gap_ready=machine.gap_ready, gap_handoff=machine.gap_handoff,
                     cache=WorkerCache(lanes, graph, worker_kind) if lanes is not None else None,
                     slices=machine.submit_slices,
                     **dict(zip(("gap_before", "release"), gap_cost.charges(graph, machine)))).run()
        start, end, worker = eng.arrays()
        tr = links.arrays()
    summary = summarize(graph, machine, durations, worker_kind, start, end, worker, links, tr, memory, sched)
    return SimResult(start, end, worker, summary, tr, graph, machine)


def worker_lanes(durations):
    """The hot and cold lanes of ``durations`` (:func:`tilecast.perfmodel.task_lanes.lanes_of`) where the
    simulation computes each task's cold share per worker when it starts (``Engine.worker_cache``); else None,
    and tasks take the durations as given (graph-order cold shares)."""
    if not Engine.worker_cache:
        return None
    from tilecast.perfmodel.task_lanes import lanes_of
    return lanes_of(durations)


def lower_bounds(durations: np.ndarray, worker_kind, overhead: float, pred_ptr, pred) -> tuple[float, float]:
    """(critical path, total work / workers), each task at its fastest usable kind plus the overhead."""
    used = sorted(set(worker_kind))
    fastest = durations[used].min(axis=0) + overhead
    if len(fastest) == 0:
        return 0.0, 0.0
    ends = native.longest_path_end(fastest, pred_ptr, pred)  # the same sweep, in C where it is built
    cp = float((ends if ends is not None else longest_path_end(fastest, pred_ptr, pred)).max())
    return cp, float(fastest.sum() / len(worker_kind))


def summarize(graph, machine, durations, worker_kind, start, end, worker, links, transfers, memory, sched) -> dict:
    pred_ptr, pred = graph.dependencies
    makespan = float(end.max()) if len(end) else 0.0
    n_w = len(machine.workers)
    busy = np.bincount(worker, weights=end - start + machine.task_overhead, minlength=n_w)
    cp, work = lower_bounds(durations, worker_kind, machine.task_overhead, pred_ptr, pred)
    link_bytes = {machine.links[i].name: int(b) for i, b in enumerate(links.bytes_per_link(transfers)) if b}
    peak = memory.peak if memory is not None else [int(graph.tile_nbytes.sum())] + [0] * (len(machine.nodes) - 1)
    return {
        "sched": sched,
        "machine": machine.name,
        "tasks": int(graph.n_tasks),
        "workers": n_w,
        "makespan_s": makespan,
        "critical_path_s": cp,
        "work_bound_s": work,
        "busy_s": busy.tolist(),
        "idle_s": (makespan - busy).tolist(),
        "utilization": float(busy.sum() / (makespan * n_w)) if makespan > 0 else 0.0,
        "flops": float(graph.flops.sum()),
        "transfers": int(len(transfers["bytes"])),
        "bytes_moved": int(transfers["bytes"].sum()),
        "bytes_per_link": link_bytes,
        "peak_memory_bytes": {machine.nodes[i].name: int(p) for i, p in enumerate(peak)},
        "evictions": memory.n_evictions if memory is not None else 0,
        "writebacks": memory.n_writebacks if memory is not None else 0,
    }
