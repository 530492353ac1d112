"""``tc.tune``: tilings, schedulers and worker counts ranked by simulation, the best run on StarPU
(``tilecast tune``). Bad input raises :class:`tilecast.errors.FieldError` naming the argument."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from tilecast.api.base import _at_least, _config, _Result, _shape, _tiling
from tilecast.errors import FieldError


@dataclass
class TuneResult(_Result):
    """Configurations ranked by predicted step time (``tilecast tune``); ``to_frame()`` is the ranking, one row
    per configuration, best first; ``executed`` the measured rows when ``execute`` asked for them
    (``executed_frame()``); ``summary`` is ``tilecast tune --json``."""

    model: str
    batch: int
    seq: int
    machine: str
    configurations: int
    skipped: list
    host_cost: bool
    best: dict
    executed: list = field(default_factory=list)
    ranking: list = field(repr=False, default_factory=list)  # Predictions, best first
    result: object = field(repr=False, default=None)  # tilecast.loop.tune.TuneResult
    execution: object = field(repr=False, default=None)  # tilecast.loop.execute.Execution
    recompute: str = "none"  # the settings searched, joined by ","
    memory_limit_bytes: int | None = None
    offload_dir: str | None = None
    limited: list = field(repr=False, default_factory=list)  # loop.execute_memory.LimitedRun, under the limit
    summary: dict = field(repr=False, default_factory=dict)

    def to_frame(self):
        import pandas as pd

        rows = [p.row() for p in self.ranking]
        for r in rows:
            r["peak_memory_bytes"] = sum(r["peak_memory_bytes"].values())
        return pd.DataFrame(rows)

    def executed_frame(self):
        """The executed configurations, predicted beside measured (empty without ``execute``)."""
        import pandas as pd

        return pd.DataFrame(self.executed)

    def _headline(self) -> str:
        return (f"{self.model} {self.batch}x{self.seq} on {self.machine}: {self.configurations} configurations, "
                f"best {self.best.get('tiling')} {self.best.get('sched')} w{self.best.get('workers')}")


def _machine(machine):
    from tilecast.perfmodel import MachineError, load_machine
    from tilecast.perfmodel.machine import Machine

    if isinstance(machine, Machine):
        return machine
    try:
        return load_machine(machine)
    except MachineError as e:
        raise FieldError(f"machine: {e}") from None


def tune(model="gpt2-tiny", batch: int = 4, seq: int = 64, machine="local", scheds=None, workers=None,
         tiles=None, max_tasks: int | None = None, execute: int = 0, others: int = 2, steps: int = 5,
         warmup: int = 2, recalibrate: bool = False, progress: bool = False, recompute="none",
         memory_limit: str | int | None = None, offload_dir: str | None = None, quiet_check: bool = False,
         report: str | None = None, offload_io: str = "buffered") -> TuneResult:
    """Rank tilings, schedulers and worker counts by simulation (``tilecast tune``). ``tiles``: tilings to
    search (default: the candidates); ``workers``: a count or a list of counts to search; ``recompute``: a
    setting, a list of them, or None (every setting with ``memory_limit``, else none); ``memory_limit`` (with
    ``offload_dir``, and ``offload_io``: ``"buffered"`` or ``"direct"``, O_DIRECT): every configuration simulated
    under StarPU's memory limit, those it cannot run skipped.
    ``execute`` K: run the K best (and ``others`` from the rest) on StarPU, local machine only, under the
    limit if any (without one, those measured within 5% of the fastest are measured again, in turns:
    :mod:`tilecast.loop.contenders`); ``recalibrate``: learn from those runs and store the models;
    ``quiet_check``: retake the runs made in a slow spell of the machine; ``report``: a folder for the
    comparison report of the best run."""
    from dataclasses import replace

    from tilecast.graph.recompute import RECOMPUTE, check_recompute
    from tilecast.loop import execute as run_configs
    from tilecast.loop import pick_for_execution
    from tilecast.loop import tune as tune_configs
    from tilecast.loop.candidates import DEFAULT_SCHEDS
    from tilecast.loop.predict import rank
    from tilecast.loop.tune import DEFAULT_MAX_TASKS

    cfg = _config(model)
    _shape(cfg, batch, seq)
    for name, v, low in (("execute", execute, 0), ("steps", steps, 1), ("warmup", warmup, 0),
                         ("others", others, 0), ("max_tasks", max_tasks if max_tasks is not None else 1, 1)):
        _at_least(name, v, low)
    if offload_dir is not None and memory_limit is None:
        raise FieldError("offload_dir needs memory_limit")
    limit = None
    if memory_limit is not None:
        from tilecast.api import _memory_limit

        limit = _memory_limit(memory_limit, offload_dir, offload_io)
    if recompute is None:
        recomputes = list(RECOMPUTE) if limit is not None else ["none"]
    else:
        recomputes = [check_recompute(r) for r in ([recompute] if isinstance(recompute, str) else recompute)]
    tilings = None
    if tiles is not None:
        tilings = [_tiling(t) for t in ([tiles] if isinstance(tiles, (str, int)) else tiles)] or None
    m = _machine(machine)
    if limit is not None:
        from tilecast.api import _one_memory_node

        _one_memory_node(m)
    if execute and m.name != "local":
        raise FieldError("execute: only the local machine can be run")
    if limit is not None and execute:
        for name, on in (("recalibrate", recalibrate), ("quiet_check", quiet_check)):
            if on:
                raise FieldError(f"{name}/memory_limit: not available together (drop one of them)")
    forecast = None
    if limit is not None:
        from tilecast.perfmodel.disk_node import ensure_disk, for_offload_io
        from tilecast.simulator.memory_capacity import MemoryForecast

        disk = ensure_disk(m, limit.offload_dir) if limit.offload_dir is not None else None
        forecast = MemoryForecast(limit.limit_bytes, for_offload_io(disk, limit.offload_io))
    workers = [workers] if isinstance(workers, int) else list(workers) if workers else None
    results = [tune_configs(cfg, batch, seq, m, scheds=tuple(scheds) if scheds else DEFAULT_SCHEDS, workers=workers,
                            tilings=tilings, max_tasks=max_tasks or DEFAULT_MAX_TASKS, progress=progress,
                            recompute=rc, memory=forecast) for rc in recomputes]
    res = results[0]
    if len(results) > 1:
        res = replace(res, ranking=rank([p for r in results for p in r.ranking]),
                      skipped=[s for r in results for s in r.skipped])
    out = TuneResult(cfg.name, batch, seq, m.name, len(res.ranking), res.skipped, bool(res.host_costs),
                     res.ranking[0].row() if res.ranking else {}, ranking=res.ranking, result=res,
                     recompute=",".join(recomputes), memory_limit_bytes=forecast.limit_bytes if forecast else None,
                     offload_dir=limit.offload_dir if limit else None)
    s = {"model": cfg.name, "batch": batch, "seq": seq, "recompute": out.recompute, "machine": m.name,
         "configurations": len(res.ranking), "skipped": res.skipped, "memory_limit_bytes": out.memory_limit_bytes,
         "offload_dir": out.offload_dir, "offload_io": limit.offload_io if limit else None,
         "host_cost": out.host_cost, "ranking": [p.row() for p in res.ranking]}
    if execute and limit is not None:
        from tilecast.loop.execute_memory import execute_limited

        chosen = pick_for_execution(res.ranking, execute, others)
        load_before = os.getloadavg()[0]
        runs = execute_limited(chosen, res.ranking, limit, steps=steps, warmup=warmup, progress=progress)
        out.limited, out.executed = runs, [r.row() for r in runs]
        s["executed"], s["load_average"] = out.executed, [load_before, os.getloadavg()[0]]
        if report and runs:
            s["report"] = runs[0].comparison(m, res.calibration, res.host_costs, forecast).write(report)
    elif execute:
        from tilecast.loop.interference import QuietGuard

        chosen = pick_for_execution(res.ranking, execute, others)
        guard = QuietGuard(workers=max(p.config.workers for p in chosen)) if quiet_check else None
        ex = run_configs(chosen, res.ranking, m, res.calibration, res.host_costs, steps=steps, warmup=warmup,
                         recalibrate=recalibrate, progress=progress, guard=guard, groups=[cfg.name] * len(chosen))
        out.executed, out.execution = ex.rows(), ex
        s["executed"] = out.executed
        if ex.quiet:
            s["quiet"] = ex.quiet
        s["load_average"] = list(ex.load_average)
        if recalibrate:
            s["calibration_files"] = ex.save_models(m)
        if report and ex.checked:
            s["report"] = ex.checked[0].comparison().write(report)
    out.summary = s
    return out
