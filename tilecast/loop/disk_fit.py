"""StarPU's own costs under a memory limit, fitted on the waits of a real memory-limited step.

The file system moves a tile in microseconds (:mod:`tilecast.perfmodel.disk_node`); StarPU spends far
more around it (its requests, allocation and eviction paths, run by the workers between kernels:
docs/memory.md). Those costs are fitted here from what the workers wait for. For every task of a
step, its *delay* is the time between the moment it could have started (its worker free, its
predecessors done) and its start: StarPU's cost between tasks, plus, under a limit, the fetching
of its tiles. The simulator (:class:`tilecast.simulator.memory_capacity.CappedMemory`) says, per
task, what its worker had to do in main memory first: tiles allocated, read back from the disk
node, written back to it, evicted clean. The measured delay less the simulated one is regressed
on those counts (non-negative least squares over every task of the steps): the seconds each such
event costs beyond what the simulator charged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: the per-task events the costs are fitted for (CappedMemory.task_events), in this order
EVENTS = ("allocs", "reads", "writebacks", "drops", "read_bytes", "writeback_bytes")


def task_delays(start, end, worker, pred_ptr, pred) -> np.ndarray:
    """Per task: its start less the latest of its worker's previous task's end and its predecessors'
    ends (0 for none); seconds."""
    start, end, worker = np.asarray(start, float), np.asarray(end, float), np.asarray(worker)
    n = len(start)
    ready = np.zeros(n)
    counts = np.diff(pred_ptr)
    has = counts > 0
    if len(pred):
        pend = np.maximum.reduceat(end[pred], pred_ptr[:-1][has]) if has.any() else np.zeros(0)
        ready[has] = pend
    prev = np.zeros(n)
    for w in np.unique(worker):
        idx = np.flatnonzero(worker == w)
        idx = idx[np.argsort(start[idx], kind="stable")]
        prev[idx[1:]] = end[idx[:-1]]
    return start - np.maximum(ready, prev)


#: the events ``calibrate``'s probes fit a cost for: per tile, not per byte. The bytes' own time is the disk node's,
#: on the disk's timeline (the page cache's speed, or the device's once the cache overflows:
#: tilecast.perfmodel.page_cache); a cost per byte in the worker fitted on the probes' 4-16 KiB tiles cannot be
#: told from a cost per tile there, and grows 16-64 times on 256 KiB tiles (docs/memory.md, 2026-12-01)
PROBE_EVENTS = ("allocs", "reads", "writebacks", "drops")


def _unit(keys) -> np.ndarray:
    """The regression's unit of each column: bytes counted in KiB, so that every column is of the same order."""
    return np.array([1.0] + [1024.0 if k.endswith("_bytes") else 1.0 for k in keys])


def _design(events: dict, n: int, keys=EVENTS) -> np.ndarray:
    """The regression's columns for ``n`` tasks: 1 (per task), then each event's (``keys``) count in its unit."""
    return np.stack([np.ones(n)] + [np.asarray(events[k], float) for k in keys], axis=1) / _unit(keys)


def _costs(x, keys=EVENTS) -> dict:
    """Seconds per task and per event (every one of :data:`EVENTS`; 0 for those not in ``keys``)."""
    x = np.asarray(x, float) / _unit(keys)
    fitted = dict(zip(keys, x[1:]))
    return {"per_task": float(x[0]), **{k: float(fitted.get(k, 0.0)) for k in EVENTS}}


def fit_event_costs(real_delays, sim_delays, events: dict) -> dict:
    """Seconds per event (:data:`EVENTS`) beyond what the simulator charged, by non-negative least squares of
    the measured less the simulated delays on the events' counts, with a constant per task (StarPU's cost
    between tasks that the simulator missed, ``per_task``); ``real_delays`` may hold several steps (a list of
    arrays, each against the same simulated step)."""
    from types import SimpleNamespace

    reals = [np.asarray(r, float) for r in (real_delays if isinstance(real_delays, list) else [real_delays])]
    return probe_weights([SimpleNamespace(events=events, sim_delays=np.asarray(sim_delays, float), real_delays=reals)],
                         EVENTS)


def delay_table(real_delays, sim_delays, events: dict) -> list[dict]:
    """Measured and simulated delays summed over groups of tasks (what each group's worker did first): the
    rows ``tasks``, ``real_s``, ``sim_s`` per group."""
    real = np.mean([np.asarray(r, float) for r in (real_delays if isinstance(real_delays, list) else [real_delays])],
                   axis=0)
    sim = np.asarray(sim_delays, float)
    ev = {k: np.asarray(v) for k, v in events.items()}
    groups = [("read back from disk", ev["reads"] > 0),
              ("wrote back, no read", (ev["writebacks"] > 0) & (ev["reads"] == 0)),
              ("evicted clean only", (ev["drops"] > 0) & (ev["reads"] == 0) & (ev["writebacks"] == 0)),
              ("allocated only", (ev["allocs"] > 0) & (ev["reads"] == 0) & (ev["writebacks"] == 0)
               & (ev["drops"] == 0)),
              ("all in memory", (ev["allocs"] == 0) & (ev["reads"] == 0) & (ev["writebacks"] == 0)
               & (ev["drops"] == 0))]
    return [{"group": g, "tasks": int(m.sum()), "real_s": float(real[m].sum()), "sim_s": float(sim[m].sum())}
            for g, m in groups]


#: the probe steps ``tilecast calibrate`` fits StarPU's costs on: (model, batch, seq, tile, limit in bytes), small
#: enough to run in seconds, tight enough that every step evicts; one whose traffic is the activations' (gpt2-tiny)
#: and one whose traffic is the optimizer's (a 1-layer, 128-wide model), at two tile sizes
PROBES = (
    ("gpt2-tiny", 2, 64, "32", 2 << 20),
    ('{"name": "probe-128", "n_layer": 1, "n_embd": 128, "n_head": 2, "vocab_size": 512, "n_positions": 64}',
     1, 64, "32", 2 << 20),
    ("gpt2-tiny", 2, 64, "64", 2 << 20),
)


#: ``calibrate`` runs a probe at the tiles of the configuration it calibrates (:func:`tile_probe`) where they hold at
#: least this many times the bytes of :data:`PROBES`' largest (64 x 64 floats): a read back of a 256 KiB tile cost a
#: worker alone 149 us where those probes gave 18-58 us (docs/memory.md, 2026-12-03)
TILE_PROBE_RATIO = 4
#: the tiles the probe's limit holds: tight enough that every step evicts, as :data:`PROBES`' limits
TILE_PROBE_TILES = 64


def tile_probe(tile_bytes: int):
    """The probe ``(model, batch, seq, tile, limit)`` of square tiles of about ``tile_bytes`` (float32; the side a
    multiple of 32): a one-layer model twice the tile wide, one sequence of one tile, a limit of
    :data:`TILE_PROBE_TILES` tiles; None where the tiles are not :data:`TILE_PROBE_RATIO` times larger than
    :data:`PROBES`' largest."""
    import json

    if tile_bytes < TILE_PROBE_RATIO * 64 * 64 * 4:
        return None
    side = max(32, int(round((tile_bytes / 4) ** 0.5 / 32)) * 32)
    width = 2 * side
    model = {"name": f"probe-tile{side}", "n_layer": 1, "n_embd": width, "n_head": max(1, width // 64),
             "vocab_size": 512, "n_positions": side}
    return (json.dumps(model), 1, side, str(side), TILE_PROBE_TILES * side * side * 4)


def probe_label(probe) -> str:
    from tilecast.graph.model_config import load_model

    model, batch, seq, tile, limit = probe
    return f"{load_model(model).name} {batch}x{seq} tile {tile} limit {limit / 2**20:g} MiB"


@dataclass
class ProbeRun:
    """One probe configuration: measured on StarPU under its limit, simulated without StarPU's costs."""

    label: str
    config: object  # tilecast.loop.config.StepConfig
    limit_bytes: int
    real_delays: list  # per timed step: per-task delay (s)
    real_step_s: float  # median timed step (s)
    sim_delays: np.ndarray
    events: dict
    base_step_s: float  # the forecast without StarPU's costs (s)


def _forecast(machine, config, limit_bytes: int, disk, graph, keep: bool = False):
    from dataclasses import replace

    from tilecast.perfmodel.disk_node import limit_prefetches
    from tilecast.loop.predict import predict, stored_models
    from tilecast.simulator.memory_capacity import MemoryForecast

    if not limit_prefetches():  # the list walks of failed prefetches: none (as predict_limited)
        disk = replace(disk, walk_s=0.0)
    calibration, host_costs = stored_models(machine)
    return predict(config, machine, calibration, host_costs, graph=graph, memory=MemoryForecast(limit_bytes, disk),
                   keep_result=keep)


def run_probe(machine, disk, directory: str, probe, workers: int, sched: str = "dmda", warmup: int = 1,
              steps: int = 2, offload_io: str = "buffered") -> ProbeRun:
    """Run the probe ``(model, batch, seq, tile, limit)`` on StarPU with the disk node in ``directory`` (``warmup`` +
    ``steps`` steps, the timed ones traced; its files written ``offload_io``) and simulate it with ``disk`` (the file
    system's figures alone, as that way of writing sees them: :func:`~tilecast.perfmodel.disk_node.for_offload_io`)."""
    from tilecast.executor.memory_limit import MemoryLimit
    from tilecast.executor.starpu_run import run_steps
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model
    from tilecast.loop.config import StepConfig

    model, batch, seq, tile, limit = probe
    config = StepConfig(load_model(model), batch, seq, Tiling.parse(tile), sched, workers)
    graph = config.build()
    p = _forecast(machine, config, limit, disk, graph, keep=True)
    res = run_steps(config.model, batch, seq, config.tiling, sched, workers, warmup + steps,
                    memory=MemoryLimit(limit, directory, offload_io), trace_from=warmup)
    pred_ptr, pred = graph.dependencies
    real = []
    for tr in res.traces:
        t = tr[tr["task"] >= 0].sort_values("task")
        real.append(task_delays(t["start_s"].to_numpy(), t["end_s"].to_numpy(), t["worker"].to_numpy(), pred_ptr,
                                pred))
    sim = p.result
    return ProbeRun(probe_label(probe), config, limit, real,
                    float(np.median(res.step_s[warmup:])),
                    task_delays(sim.start, sim.end, sim.worker, pred_ptr, pred), sim.task_events, p.step_s)


def probe_weights(runs, keys=PROBE_EVENTS, per_task: float | None = None) -> dict:
    """Seconds per task and per event (``keys``) by non-negative least squares of the probe runs' measured less
    simulated delays, over every task of every run. With ``per_task`` given, the cost per task is that figure and
    only the events' are fitted: in a probe whose every task allocates, a cost per task and a cost per tile
    allocated stand for one another (the fit put 159 us on either, home by home), and a step that allocates for
    fewer of its tasks pays for the wrong one (docs/memory.md, 2026-12-07)."""
    from scipy.optimize import nnls

    cols, rhs = [], []
    for r in runs:
        a = _design(r.events, len(r.sim_delays), keys)
        for d in r.real_delays:
            cols.append(a if per_task is None else a[:, 1:])
            rhs.append(d - r.sim_delays - (0.0 if per_task is None else per_task))
    x, _ = nnls(np.concatenate(cols), np.concatenate(rhs))
    return _costs(x if per_task is None else np.concatenate([[per_task], x]), keys)


def fit_probe_costs(machine, disk, runs: list[ProbeRun], keys=PROBE_EVENTS,
                    per_task: float | None = None) -> tuple[dict, list[dict]]:
    """StarPU's costs in the worker (``DiskNode.worker_costs``) fitted on probe runs: the weights of the events
    (``keys``) as :func:`probe_weights` fits them (the cost per task too, unless ``per_task`` gives it), then one
    factor on them all that makes the forecast steps best match the measured ones (least squares on relative
    errors: some of a task's delay is hidden behind the other worker's work, which the per-task fit cannot see).
    Returns (costs, one row per probe: ``probe``, ``measured_step_s``, ``base_step_s`` (forecast without
    StarPU's costs), ``predicted_step_s`` (with them), ``error``)."""
    from dataclasses import replace

    costs = probe_weights(runs, keys, per_task)
    with_costs = replace(disk, runtime_latency=0.0, worker_costs=costs)
    p1 = np.array([_forecast(machine, r.config, r.limit_bytes, with_costs, None).step_s for r in runs])
    p0 = np.array([r.base_step_s for r in runs])
    meas = np.array([r.real_step_s for r in runs])
    gain = (p1 - p0) / meas
    k = float(np.dot(gain, (meas - p0) / meas) / max(np.dot(gain, gain), 1e-30))
    k = min(max(k, 0.0), 20.0)
    costs = {key: v * k for key, v in costs.items()}
    final = replace(disk, runtime_latency=0.0, worker_costs=costs)
    rows = []
    for r in runs:
        pred = _forecast(machine, r.config, r.limit_bytes, final, None).step_s
        rows.append({"probe": r.label, "measured_step_s": r.real_step_s, "base_step_s": r.base_step_s,
                     "predicted_step_s": pred, "error": (pred - r.real_step_s) / r.real_step_s})
    return costs, rows


def _base(disk, offload_io: str):
    """``disk`` without StarPU's fitted costs, as ``offload_io`` sees it
    (:func:`~tilecast.perfmodel.disk_node.for_offload_io`); the walk's cost per tile (``walk_tile_s``, timed apart) is
    kept, so that the probes' simulated delays include it."""
    from dataclasses import replace

    from tilecast.perfmodel.disk_node import for_offload_io

    bare = replace(disk, runtime_latency=0.0, runtime_source="", worker_costs={}, worker_costs_source="",
                   worker_costs_by_workers={}, tile_costs={}, direct_costs={})
    return for_offload_io(bare, offload_io)


def calibrate_worker_costs(machine, disk, directory: str, probes=PROBES, workers: int = 2, progress=None,
                           offload_io: str = "buffered"):
    """(DiskNode with ``worker_costs`` fitted on ``probes`` run in ``directory``, rows of :func:`fit_probe_costs`).
    ``disk``: the file system's figures (``runtime_latency`` and any earlier costs are not used); ``offload_io``: how
    the probes' disk node writes its files (``direct``: the node returned is :meth:`DiskNode.direct`'s view)."""
    from dataclasses import replace

    base = _base(disk, offload_io)
    runs = []
    for i, probe in enumerate(probes):
        if progress:
            progress(i, len(probes), probe_label(probe))
        runs.append(run_probe(machine, base, directory, probe, workers, offload_io=offload_io))
    costs, rows = fit_probe_costs(machine, base, runs)
    names = "; ".join(r.label for r in runs)
    return replace(base, worker_costs=costs, tile_costs=dict(disk.tile_costs), worker_costs_source=(
        f"fitted by tilecast calibrate on probe steps ({names}; {workers} workers, dmda, {offload_io}): per-task "
        f"delays, measured less simulated, on the events of each task's acquisition, then scaled to the steps")), rows


def calibrate_tile_costs(machine, disk, directory: str, probe, counts, progress=None,
                         offload_io: str = "buffered", per_task: dict | None = None) -> tuple[dict, list[dict]]:
    """(``DiskNode.tile_costs``, rows of :func:`fit_probe_costs`): StarPU's costs in the worker fitted on the one
    ``probe`` (:func:`tile_probe`) alone, run in ``directory`` on each worker count of ``counts``. ``disk``: the file
    system's figures; ``offload_io``: as :func:`calibrate_worker_costs`; ``per_task``: by worker count (``"1"``,
    ``"2"``), the cost per task the events' costs are fitted around (those fitted on :data:`PROBES`, whose tasks
    do not all allocate), scaled with them to the probe's step; a count it lacks has its cost per task fitted with
    them."""
    from tilecast.perfmodel.disk_node import typical_tile_bytes

    base = _base(disk, offload_io)
    by_workers, rows, tile_bytes = {}, [], 0
    for i, w in enumerate(counts):
        if progress:
            progress(i, len(counts), w, probe_label(probe))
        run = run_probe(machine, base, directory, probe, w, offload_io=offload_io)
        tile_bytes = typical_tile_bytes(run.config.build().tile_nbytes)
        costs, w_rows = fit_probe_costs(machine, base, [run], per_task=(per_task or {}).get(str(w)))
        by_workers[str(w)] = costs
        rows += [{**r, "workers": w} for r in w_rows]
    return {"tile_bytes": tile_bytes, "by_workers": by_workers,
            "source": f"fitted by tilecast calibrate on the probe step {probe_label(probe)} alone, dmda, "
                      f"{offload_io}" + ("; the cost per task the standard probes'" if per_task else "")}, rows
