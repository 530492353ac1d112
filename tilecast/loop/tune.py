"""Search configurations by simulation and rank them by predicted step time.

>>> result = tune(load_model("gpt2-tiny"), 4, 64)          # doctest: +SKIP
>>> result.ranking[0].config.label(), result.ranking[0].step_s
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from tilecast.errors import FieldError
from tilecast.loop.candidates import DEFAULT_SCHEDS, candidate_tilings, worker_counts
from tilecast.loop.config import StepConfig
from tilecast.loop.predict import predict, rank

DEFAULT_MAX_TASKS = 100_000


@dataclass
class TuneResult:
    ranking: list  # Predictions, best first
    skipped: list = field(default_factory=list)  # {"tiling", "reason"}
    machine: object = None
    calibration: object = None
    host_costs: dict = field(default_factory=dict)
    graphs: dict = field(default_factory=dict)  # tiling description -> Graph


def starpu_policies() -> set | None:
    """Scheduling policies of the installed StarPU, or None when StarPU cannot be loaded here."""
    try:
        from tilecast.executor.starpu_session import policies

        return set(policies())
    except Exception:  # no StarPU library or no compiler: tune still simulates
        return None


def starpu_max_workers() -> int | None:
    try:
        from tilecast.executor.starpu_session import max_workers

        return max_workers()
    except Exception:
        return None


def usable_scheds(requested) -> list:
    """Requested policies that both the simulator models and (when present) StarPU offers."""
    from tilecast.simulator.simulate import POLICIES

    offered = starpu_policies()
    return [s for s in requested if s in POLICIES and (offered is None or s in offered)]


def build_candidates(cfg, batch: int, seq: int, tilings=None, max_tasks: int = DEFAULT_MAX_TASKS,
                     recompute: str = "none"):
    """([(tiling, graph)], skipped): coarsest first; finer tilings stop once a graph exceeds ``max_tasks``.
    A tiling whose step would have over ``max_tasks`` tasks, or whose simulation would not fit in the memory left
    by the graphs kept so far, is skipped without being built (:mod:`tilecast.graph.size_estimate`)."""
    from tilecast.graph import TilingError
    from tilecast.graph.models import build_step
    from tilecast.graph.size_estimate import BYTES_PER_TASK, available_memory, memory_refusal, step_tasks

    explicit = bool(tilings)
    tilings = list(tilings) if tilings else candidate_tilings(cfg, batch, seq)[::-1]
    graphs, skipped = [], []
    over = {}  # family (dimensions named) -> the largest tile size found over max_tasks
    kept, have = 0, available_memory()  # tasks of the graphs kept; memory available when the search began
    for t in tilings:
        family = tuple(sorted(t.sizes))
        size = max(t.sizes.values(), default=0)
        if not explicit and family in over and size <= over[family]:
            skipped.append({"tiling": t.describe(), "reason": f"max_tasks: finer than a tiling already over {max_tasks} tasks"})
            continue  # finer tilings of a family only have more tasks: not worth building
        try:
            n = step_tasks(cfg, batch, seq, t, recompute)
            if n > max_tasks:  # counted, not built
                skipped.append({"tiling": t.describe(), "reason": f"max_tasks: {n} tasks, over {max_tasks}"})
                over[family] = max(size, over.get(family, 0))
                continue
            why = memory_refusal(n, "simulate", have - BYTES_PER_TASK["kept"] * kept)
            if why:
                skipped.append({"tiling": t.describe(), "reason": f"memory: beside the graphs kept, {why}"})
                continue
            g = build_step(cfg, batch, seq, t, recompute=recompute)
        except TilingError as e:  # e.g. a head tile that splits a Llama's groups of query heads
            skipped.append({"tiling": t.describe(), "reason": str(e).removeprefix("tile: ")})
            continue
        kept += g.n_tasks
        graphs.append((t, g))
    return graphs, skipped


def too_large_hint(cfg, batch, seq, recompute, max_tasks, skipped) -> str:
    """"; tile N gives M tasks" (the finest uniform tile that fits) when tilings were skipped as too large."""
    from tilecast.graph.size_estimate import fit_hint, fitting_tile

    if not any(s["reason"].startswith(("max_tasks", "memory")) for s in skipped):
        return ""
    return "; " + fit_hint(fitting_tile(cfg, batch, seq, recompute, "simulate", max_tasks))


def tune(cfg, batch: int, seq: int, machine=None, scheds=DEFAULT_SCHEDS, workers=None, tilings=None,
         max_tasks: int = DEFAULT_MAX_TASKS, host: bool = True, progress: bool = True,
         recompute: str = "none", memory=None) -> TuneResult:
    """Rank every (tiling, scheduler, worker count) of a step by simulation on ``machine`` (default: local).

    Every candidate step has the activation recompute setting ``recompute``
    (:mod:`tilecast.graph.recompute`).

    Kernels are calibrated on first use and host costs measured on StarPU when
    it is available (both stored and reused); configurations whose tiles do not
    fit the memory node are ranked last, marked ``fits=False``.

    ``memory``: a main-memory limit (:class:`tilecast.simulator.memory_capacity.MemoryForecast`): every
    configuration is simulated under it, and those it cannot run (below their smallest working set) are
    not simulated but listed in ``skipped`` with the reason and the worker count.
    """
    from tilecast.loop.host_cost import ensure_host_costs
    from tilecast.loop.kernel_calibration import ensure_calibration
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.kernel_model import DurationModel

    machine = machine or load_machine("local")
    scheds = usable_scheds(scheds)
    if not scheds:
        raise FieldError("scheds: none of the requested schedulers is both simulated and offered by StarPU")
    limit = len(machine.workers)
    cap = starpu_max_workers() if machine.name == "local" else None  # the local machine runs on StarPU
    if cap is not None:
        limit = min(limit, cap)
    workers = list(workers) if workers else worker_counts(limit)
    bad = [w for w in workers if not 1 <= w <= limit]
    if bad:
        raise FieldError(f"workers: worker count {bad[0]} is outside 1..{limit} for {machine.name}")
    graphs, skipped = build_candidates(cfg, batch, seq, tilings, max_tasks, recompute)
    if not graphs:
        raise FieldError("tilings: no candidate tiling can be built: " + "; ".join(
            f"{s['tiling']}: {s['reason']}" for s in skipped[:2]) + ("; ..." if len(skipped) > 2 else "")
            + too_large_hint(cfg, batch, seq, recompute, max_tasks, skipped))
    host_costs = {}
    if host and machine.name == "local" and starpu_policies() is not None:
        host_costs = ensure_host_costs(machine, workers, progress=progress, scheds=scheds)
    cal = ensure_calibration(machine, [g for _, g in graphs], progress=progress) if machine.name == "local" else None
    # durations per worker count, as predict() computes them for one configuration (tilecast simulate, accuracy):
    # a kernel's calibrated and learned times depend on how many workers are busy (Calibration.arrays)
    models = {w: DurationModel(machine.with_workers(w), cal) for w in workers}
    preds = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(graphs) * len(scheds) * len(workers), desc="simulating", unit="config",
                   file=sys.stderr, leave=False)
    try:
        for t, g in graphs:
            for w in workers:
                durations = None
                refused = memory.refusal([g], w) if memory is not None else None
                if refused:
                    skipped.append({"tiling": t.describe(), "workers": w, "recompute": recompute,
                                    "reason": refused})
                    if bar is not None:
                        bar.update(len(scheds))
                    continue
                for s in scheds:
                    c = StepConfig(cfg, batch, seq, t, s, w, recompute)
                    if durations is None:
                        durations = models[w].durations(g)
                    preds.append(predict(c, machine, cal, host_costs, graph=g, durations=durations, memory=memory))
                    if bar is not None:
                        bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return TuneResult(rank(preds), skipped, machine, cal, host_costs,
                      {t.describe(): g for t, g in graphs})


def calibrate_candidates(steps, machine=None, scheds=DEFAULT_SCHEDS, workers=None,
                         max_tasks: int = DEFAULT_MAX_TASKS, progress: bool = True):
    """Calibrate the local machine for the candidates of several steps at once (``steps``: (cfg, batch, seq)
    tuples): the host-cost probes, then the kernel shapes of every candidate graph under one timing budget
    (:func:`tilecast.loop.kernel_calibration.ensure_calibration`), so that :func:`tune` of each step then
    finds them stored. Returns (calibration, wall seconds)."""
    import time

    from tilecast.loop.host_cost import ensure_host_costs
    from tilecast.loop.kernel_calibration import ensure_calibration
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.shapes import graph_shapes

    start = time.monotonic()
    machine = machine or load_machine("local")
    shapes = [graph_shapes(g) for cfg, batch, seq in steps  # shapes only: the graphs are not all kept in memory
              for _, g in build_candidates(cfg, batch, seq, None, max_tasks)[0]]
    limit = min(len(machine.workers), starpu_max_workers() or len(machine.workers))
    if starpu_policies() is not None:
        ensure_host_costs(machine, list(workers) if workers else worker_counts(limit), progress=progress,
                          scheds=usable_scheds(scheds))
    cal = ensure_calibration(machine, shapes, progress=progress)
    return cal, time.monotonic() - start


def pick_for_execution(ranking: list, k: int, others: int = 2) -> list:
    """The ``k`` best fitting configurations and ``others`` spread over the rest of the ranking (the last included)."""
    fitting = [p for p in ranking if p.fits]
    chosen = fitting[:k]
    rest = fitting[k:]
    n = min(max(others, 0), len(rest))
    idx = sorted({round((i + 1) * (len(rest) - 1) / n) for i in range(n)}) if n else []
    return chosen + [rest[i] for i in idx]
