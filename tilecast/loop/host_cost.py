"""What a step costs the executor besides its kernels' makespan, measured on small probe steps.

A timed step of ``tilecast run`` is not only the tasks' makespan: the host
prepares every tile buffer, registers it with StarPU and unregisters it
afterwards, submits every task from one thread, and builds the trace; StarPU
schedules each task, updates its history-based performance model and runs its
callback. These costs are measured on real runs of a few small probe steps
(gpt2-tiny, fine tilings: many tasks, little kernel time), each less its
simulated makespan:

    host_s = fixed + per_tile * tiles + per_task * tasks (+ stretch * makespan)

(non-negative least squares, one fit per worker count because idle StarPU
workers spin and compete with the submitting thread for the cores). Runs with
empty codelets (``dry``) would miss the per-task performance-model updates,
which cost several microseconds a task here. The prediction of a step is
``host_s`` plus its simulated makespan. Fits are stored beside the kernel
calibration and reused until the executor's code changes.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass

import numpy as np
from scipy.optimize import nnls

FORMAT = 3
# The executor's code the fits describe: a change to any of these files invalidates stored fits.
EXECUTOR_FILES = ("executor/starpu_execute.py", "executor/starpu_run.py", "executor/starpu_session.py",
                  "executor/starpu_native.py", "executor/tiles.py", "executor/c/starpu_glue.c", "trace.py")
PROBES = (("gpt2-tiny", 2, 32, "256"), ("gpt2-tiny", 4, 64, "64"), ("gpt2-tiny", 4, 64, "32"),
          ("gpt2-tiny", 8, 128, "32"), ("gpt2-tiny", 8, 128, "16"))
PROBE_SCHED = "eager"


@dataclass
class HostCost:
    """``fixed + per_tile * tiles + per_task * tasks + stretch * makespan`` seconds per step, one worker count.

    ``stretch`` is the share by which real makespans exceed simulated ones (it
    stays 0 until real steps are learned, see :func:`learn_from_runs`): a
    shape's model is the median of its measured durations, while a makespan
    adds up their mean, which interruptions of the workers raise.
    """

    workers: int
    fixed_s: float
    per_tile_s: float
    per_task_s: float
    points: list  # [tiles, tasks, simulated makespan s, measured s - makespan s] fitted
    stretch: float = 0.0

    def seconds(self, n_tiles: int, n_tasks: int, makespan_s: float = 0.0) -> float:
        return self.fixed_s + self.per_tile_s * n_tiles + self.per_task_s * n_tasks + self.stretch * makespan_s

    @classmethod
    def fit(cls, workers: int, points) -> "HostCost":
        p = np.asarray(points, dtype=np.float64)
        x = np.stack([np.ones(len(p)), p[:, 0], p[:, 1], p[:, 2]], axis=1)
        w = 1.0 / (p[:, 2] + p[:, 3])  # relative error of the step time: small and large steps weigh alike
        scale = x.max(axis=0)
        scale[scale == 0] = 1.0
        c, _ = nnls((x / scale) * w[:, None], p[:, 3] * w)
        c = c / scale
        return cls(workers, float(c[0]), float(c[1]), float(c[2]), p.tolist(), float(c[3]))


MAX_POINTS = 60  # points kept per fit: the probes and the most recent real steps


def fit_key(workers: int, sched: str) -> str:
    """Key of a fit learned from real runs of one scheduler (probe fits are keyed by the worker count)."""
    return f"{workers}:{sched}"


def host_cost_for(fits: dict, workers: int, sched: str):
    """The fit learned for this scheduler and worker count, else the worker count's probe fit, else None."""
    if not fits:
        return None
    return fits.get(fit_key(workers, sched)) or fits.get(workers)


def learn_from_runs(fits: dict, runs) -> dict:
    """Fits refined with measured steps: ``runs`` = [(workers, sched, tiles, tasks, makespan_s, measured_s)].

    A real step's time beyond its simulated makespan (with kernel models learned
    from the same run) is what this model stands for: the host's work plus the
    runtime's per-task costs and scheduling gaps the simulation leaves out. The
    policies' own costs differ (dmda estimates every task's end on every
    worker), so each scheduler gets its own fit, started from the probe points.
    """
    out = dict(fits)
    for w, sched in sorted({(r[0], r[1]) for r in runs}):
        new = [[t, n, mk, max(s - mk, 1e-6)] for ww, ss, t, n, mk, s in runs if (ww, ss) == (w, sched)]
        key = fit_key(w, sched)
        old = out[key].points if key in out else (out[w].points if w in out else [])
        out[key] = HostCost.fit(w, (old + new)[-MAX_POINTS:])
    return out


def executor_fingerprint() -> str:
    import hashlib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for name in EXECUTOR_FILES:
        f = root / name
        h.update(name.encode() + b"\0" + (f.read_bytes() if f.exists() else b"-") + b"\0")
    return h.hexdigest()[:16]


def _path(machine) -> str:
    from tilecast.perfmodel.calibration import tilecast_home

    return os.path.join(tilecast_home(), "calibration", f"host-{machine.name}-{machine.fingerprint()}.json")


def load_host_costs(machine) -> dict:
    try:
        with open(_path(machine)) as f:
            doc = json.load(f)
        if doc.get("format") != FORMAT or doc.get("executor") != executor_fingerprint():
            return {}
        return {(k if ":" in k else int(k)): HostCost(**h) for k, h in doc["fits"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def save_host_costs(machine, fits: dict) -> str:
    path = _path(machine)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"format": FORMAT, "machine": machine.name, "fingerprint": machine.fingerprint(),
                   "executor": executor_fingerprint(),
                   "fits": {str(w): asdict(h) for w, h in fits.items()}}, f, indent=1)
    os.replace(tmp, path)
    return path


def probe_graphs(probes=PROBES) -> list:
    from tilecast.graph import Tiling
    from tilecast.graph.gpt2 import build_gpt2_step
    from tilecast.graph.model_config import load_model

    return [(load_model(name), batch, seq, build_gpt2_step(load_model(name), batch, seq, Tiling.parse(tile)))
            for name, batch, seq, tile in probes]


def measure_probes(machine, calibration, workers: int, probes=PROBES, repeats: int = 15, sched: str = PROBE_SCHED,
                   progress=None) -> list:
    """[tiles, tasks, simulated makespan, median seconds less that makespan] of real runs of each probe step."""
    from tilecast.simulator.simulate import simulate

    m = machine.with_workers(workers)
    points = []
    for graph, wall in measure_walls(workers, probes, repeats, sched, progress):
        makespan = simulate(graph, m, sched, calibration=calibration).makespan
        points.append([graph.n_tiles, graph.n_tasks, makespan, max(wall - makespan, 1e-6)])
    return points


def measure_walls(workers: int, probes=PROBES, repeats: int = 5, sched: str = PROBE_SCHED, progress=None) -> list:
    """[(graph, median seconds)] of training steps of each probe, timed as ``tilecast run`` times them.

    One warm-up step, then ``repeats`` timed steps without building a trace
    (as every step of ``tilecast run`` but the last).
    """
    from tilecast.executor.starpu_run import StarPUTraining
    from tilecast.executor.starpu_session import StarPUSession
    from tilecast.executor.step import TrainState, init_gpt2_params

    out = []
    with StarPUSession(sched, workers) as session:
        for cfg, batch, seq, graph in probe_graphs(probes):
            data = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(repeats + 1, batch, seq + 1))
            training = StarPUTraining(session, graph, TrainState(init_gpt2_params(cfg, 0)), data)
            times = []
            for _ in range(repeats + 1):
                times.append(training.step(trace=False)[0])
                if progress:
                    progress()
            out.append((graph, float(np.median(times[1:]))))
    return out


def ensure_host_costs(machine, worker_counts, progress: bool = True) -> dict:
    """Host cost fits for every worker count, measured (and stored) for those not stored yet.

    The probe steps' kernel shapes are calibrated first if the stored calibration lacks them.
    """
    from tilecast.loop.kernel_calibration import ensure_calibration

    fits = load_host_costs(machine)
    todo = [w for w in worker_counts if w not in fits]
    if not todo:
        return fits
    calibration = ensure_calibration(machine, [g for *_, g in probe_graphs()], progress=progress)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(todo) * len(PROBES) * 16, desc="measuring the executor's per-step cost", unit="run",
                   file=sys.stderr, leave=False)
    try:
        for w in todo:
            fits[w] = HostCost.fit(w, measure_probes(machine, calibration, w,
                                                     progress=(lambda: bar.update(1)) if bar else None))
    finally:
        if bar is not None:
            bar.close()
    save_host_costs(machine, fits)
    return fits
