"""Predicted step time of a configuration: simulated makespan plus the executor's host cost.

:func:`predict` is the one prediction path: ``tilecast tune`` (and what runs
on its ranking), ``tilecast simulate``, ``accuracy`` and ``demo`` all predict
a configuration with it, from the models stored for the machine
(:func:`stored_models`, or those ``tune`` has just completed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Prediction:
    """What the loop predicts for one configuration (``fits`` False: over a memory node's capacity)."""

    config: object
    step_s: float
    makespan_s: float
    host_s: float
    peak_memory_bytes: dict
    tasks: int
    tiles: int
    fits: bool = True
    summary: dict = field(default_factory=dict)
    result: object = None  # the SimResult (its trace() is the predicted trace)
    host_source: str | None = None  # where host_s comes from; None: not measured for this machine (host_s = 0)
    task_overhead_s: float = 0.0  # the runtime's cost per task the simulation charged
    task_overhead_source: str = "machine description"

    @property
    def host_known(self) -> bool:
        return self.host_source is not None

    @property
    def tokens_per_s(self) -> float:
        return self.config.tokens / self.step_s

    def row(self) -> dict:
        return {**self.config.to_dict(), "pred_step_s": self.step_s, "pred_makespan_s": self.makespan_s,
                "pred_host_s": self.host_s, "tokens_per_s": self.tokens_per_s, "tasks": self.tasks,
                "tiles": self.tiles, "peak_memory_bytes": self.peak_memory_bytes, "fits": self.fits}


def host_note(p: Prediction, machine) -> str:
    """Where a prediction's host cost comes from, or why it is left out of its step time."""
    if p.host_known:
        return p.host_source
    if machine.name == "local":
        return (f"unknown: not measured yet for {p.config.workers} workers (tilecast tune measures it on StarPU); "
                "the step time is the makespan alone")
    return f"unknown: measured only on the local machine, not on {machine.name}; the step time is the makespan alone"


def capacity_check(graph, machine) -> tuple[bool, dict]:
    """Does every tile of the step fit in the first memory node (where the CPU executor keeps them all)?"""
    need = int(graph.tile_nbytes.sum())
    node = machine.nodes[machine.workers[0].node]
    return need <= node.capacity, {node.name: need}


def fits_memory(peak: dict, machine) -> bool:
    """Every memory node's predicted peak within its capacity."""
    return all(peak.get(n.name, 0) <= n.capacity for n in machine.nodes)


def stored_models(machine) -> tuple:
    """(kernel calibration or None, host-cost fits) stored for ``machine`` (as described, all its workers):
    what ``tune`` predicts with once it has calibrated the shapes and measured the host cost."""
    from tilecast.loop.host_cost import load_host_costs
    from tilecast.perfmodel.calibration import find_calibration

    return find_calibration(machine), load_host_costs(machine)


def with_submitting_thread(m, machine, workers: int, per_task: float):
    """``m`` with the executor's thread that submits the graph, ``per_task`` seconds of wall time per task as the
    probes measured it with ``workers`` workers. Where the workers leave it no core (as many workers as cores),
    it takes its turns on one worker's core (:class:`tilecast.simulator.submit_slices.SubmitSlices`): half of
    ``per_task`` on a core per task, since it runs one turn in two, in turns of a timer tick
    (:func:`tilecast.simulator.ranks_threads.tick_slice_s`), after the resumed workers hold every core for half
    a tick; a submission done within half a tick of the resume is not cut. With a core to spare, or the core
    count unknown, it submits beside the workers at ``per_task``."""
    from tilecast.simulator.ranks_threads import tick_slice_s
    from tilecast.simulator.submit_slices import SubmitSlices

    m = m.with_submission(per_task)
    cores = machine.meta.get("hardware", {}).get("cores")
    if not cores or workers < int(cores) or per_task <= 0:
        return m
    tick = tick_slice_s(int(cores))
    return m.with_submit_slices(SubmitSlices(workers, per_task / 2, tick, tick / 2, escape_s=tick / 2))


def predict(config, machine, calibration, host_costs: dict | None = None, graph=None, durations=None,
            keep_result: bool = False, transfers: bool = True, seed: int = 0, memory=None) -> Prediction:
    """Simulate ``config`` on ``machine`` (all its workers; ``config.workers`` of them are used).

    ``host_costs``: fits of :mod:`tilecast.loop.host_cost` ({workers or
    "workers:sched": HostCost}): the host's cost per step, added to the
    makespan, and the runtime's measured cost per task, charged before every
    simulated task; without one for the worker count the prediction is the
    makespan alone (``host_source`` None), with the machine description's
    cost per task. ``durations``: the graph's per-task durations, if already
    computed (they do not depend on the scheduler or worker count).
    ``transfers`` and ``seed``: as :func:`tilecast.simulator.simulate.simulate`.
    ``memory``: a main-memory limit (:class:`tilecast.simulator.memory_capacity.MemoryForecast`): with a
    disk node the step is simulated with eviction to it
    (:func:`~tilecast.simulator.memory_capacity.simulate_memory_limited`), without one every tile must fit.
    """
    from tilecast.loop.host_cost import host_cost_for, host_cost_source
    from tilecast.simulator.simulate import simulate

    graph = graph if graph is not None else config.build()
    m = machine.with_workers(config.workers)
    host = host_cost_for(host_costs, config.workers, config.sched)
    overhead_source = "machine description"
    if host is not None and host.task_overhead_s is not None:
        m = m.with_task_overhead(host.task_overhead_for(config.graph_id)).with_gap_costs(*host.gap_costs)
        overhead_source = ("measured on StarPU traces, and this task graph's own runs" if
                           config.graph_id in host.graph_excess else "measured on StarPU traces")
    if host is not None and host.decides:
        m = m.with_decision_cost(host.decision_scan_s, host.decision_lock_s)
    if host is not None and host.push_walk_s > 0:
        m = m.with_push_walk(host.push_walk_s).with_walk_far(host.walk_far_s, host.walk_knee)
    if host is not None and host.submit_task_s > 0:
        m = with_submitting_thread(m, machine, config.workers, host.submit_task_s)
    whole, peak = capacity_check(graph, m)
    if durations is None:
        from tilecast.perfmodel.kernel_model import DurationModel

        durations = DurationModel(m, calibration).durations(graph)
    if memory is not None and memory.disk is not None:
        from tilecast.simulator.memory_capacity import simulate_memory_limited

        res = simulate_memory_limited(graph, m, memory.limit_bytes, memory.disk, config.sched, durations=durations,
                                      seed=seed, page_cache=getattr(memory, "page_cache", None))
    else:
        res = simulate(graph, m, config.sched, durations=durations, transfers=transfers, seed=seed)
    host_s = host.seconds(graph.n_tiles, graph.n_tasks) if host is not None else 0.0
    sim_peak = res.summary["peak_memory_bytes"]
    if memory is not None:  # the limit's own check (minimum working set) comes first, in the caller
        peak = dict(sim_peak) if memory.disk is not None else peak
        fits = memory.disk is not None or peak[m.nodes[0].name] <= memory.limit_bytes
    elif len(m.nodes) == 1:
        peak = {k: max(v, peak.get(k, 0)) for k, v in sim_peak.items()}  # the CPU executor allocates every tile
        fits = whole
    else:
        peak = dict(sim_peak)
        fits = fits_memory(peak, m)
    return Prediction(config=config, step_s=res.makespan + host_s, makespan_s=res.makespan, host_s=host_s,
                      peak_memory_bytes=peak, tasks=int(graph.n_tasks), tiles=int(graph.n_tiles), fits=fits,
                      summary=res.summary, result=res if keep_result else None,
                      host_source=host_cost_source(host_costs, config.workers, config.sched),
                      task_overhead_s=m.task_overhead, task_overhead_source=overhead_source)


def rank(predictions) -> list:
    """Fitting configurations first, fastest predicted step first (ties: fewer tasks, then label)."""
    return sorted(predictions, key=lambda p: (not p.fits, p.step_s, p.tasks, p.config.label()))


def relative_error(pred: float, real: float) -> float:
    return float((pred - real) / real) if real > 0 else float(np.nan)
