"""Predicted step time of a configuration: simulated makespan plus the executor's host cost."""

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

    @property
    def tokens_per_s(self) -> float:
        return self.config.tokens / self.step_s

    def row(self) -> dict:
        return {**self.config.to_dict(), "pred_step_s": self.step_s, "pred_makespan_s": self.makespan_s,
                "pred_host_s": self.host_s, "tokens_per_s": self.tokens_per_s, "tasks": self.tasks,
                "tiles": self.tiles, "peak_memory_bytes": self.peak_memory_bytes, "fits": self.fits}


def capacity_check(graph, machine) -> tuple[bool, dict]:
    """Does every tile of the step fit in the first memory node (where the CPU executor keeps them all)?"""
    need = int(graph.tile_nbytes.sum())
    node = machine.nodes[machine.workers[0].node]
    return need <= node.capacity, {node.name: need}


def fits_memory(peak: dict, machine) -> bool:
    """Every memory node's predicted peak within its capacity."""
    return all(peak.get(n.name, 0) <= n.capacity for n in machine.nodes)


def predict(config, machine, calibration, host_costs: dict | None = None, graph=None, durations=None,
            keep_result: bool = False) -> Prediction:
    """Simulate ``config`` on ``machine`` (all its workers; ``config.workers`` of them are used).

    ``host_costs``: fits of :mod:`tilecast.loop.host_cost` ({workers or
    "workers:sched": HostCost}): the host's cost per step, added to the
    makespan, and the runtime's measured cost per task, charged before every
    simulated task; without one for the worker count the prediction is the
    makespan alone, with the machine description's cost per task.
    ``durations``: the graph's per-task durations, if already computed (they do
    not depend on the scheduler or worker count).
    """
    from tilecast.loop.host_cost import host_cost_for
    from tilecast.simulator.simulate import simulate

    graph = graph if graph is not None else config.build()
    m = machine.with_workers(config.workers)
    host = host_cost_for(host_costs, config.workers, config.sched)
    if host is not None and host.task_overhead_s is not None:
        m = m.with_task_overhead(host.task_overhead_s)
    whole, peak = capacity_check(graph, m)
    if durations is None:
        from tilecast.perfmodel.kernel_model import DurationModel

        durations = DurationModel(m, calibration).durations(graph)
    res = simulate(graph, m, config.sched, durations=durations)
    host_s = host.seconds(graph.n_tiles, graph.n_tasks) if host is not None else 0.0
    sim_peak = res.summary["peak_memory_bytes"]
    if len(m.nodes) == 1:
        peak = {k: max(v, peak.get(k, 0)) for k, v in sim_peak.items()}  # the CPU executor allocates every tile
        fits = whole
    else:
        peak = dict(sim_peak)
        fits = fits_memory(peak, m)
    return Prediction(config=config, step_s=res.makespan + host_s, makespan_s=res.makespan, host_s=host_s,
                      peak_memory_bytes=peak, tasks=int(graph.n_tasks), tiles=int(graph.n_tiles), fits=fits,
                      summary=res.summary, result=res if keep_result else None)


def rank(predictions) -> list:
    """Fitting configurations first, fastest predicted step first (ties: fewer tasks, then label)."""
    return sorted(predictions, key=lambda p: (not p.fits, p.step_s, p.tasks, p.config.label()))


def relative_error(pred: float, real: float) -> float:
    return float((pred - real) / real) if real > 0 else float(np.nan)
