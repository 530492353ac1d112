"""What a step costs the executor besides its kernels, measured with empty codelets.

A timed step of ``tilecast run`` is not only the tasks' makespan: the host
prepares every tile buffer, registers it with StarPU and unregisters it
afterwards, submits every task from one thread, and builds the trace; StarPU
schedules each task and runs its callback. Running the step's graph with
empty codelets (``StarPUSession.execute(dry=True)``) costs exactly these and
nothing else, so the model is fitted on such dry runs of a few probe graphs:

    host_s = fixed + per_tile * tiles + per_task * tasks

(non-negative least squares, one fit per worker count because idle StarPU
workers spin and compete with the submitting thread for the cores). The
prediction of a step is then ``host_s`` plus the simulated makespan. Fits are
stored beside the kernel calibration and reused.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
from scipy.optimize import nnls

FORMAT = 1
PROBES = (("gpt2-tiny", 2, 32, "256"), ("gpt2-tiny", 4, 64, "64"), ("gpt2-tiny", 4, 64, "32"),
          ("gpt2-tiny", 8, 128, "32"), ("gpt2-tiny", 8, 128, "16"))
PROBE_SCHED = "eager"  # empty codelets carry no performance model, so the policy hardly matters


@dataclass
class HostCost:
    """``fixed + per_tile * tiles + per_task * tasks`` seconds per step, for one worker count."""

    workers: int
    fixed_s: float
    per_tile_s: float
    per_task_s: float
    points: list  # [tiles, tasks, seconds] of the dry runs fitted

    def seconds(self, n_tiles: int, n_tasks: int) -> float:
        return self.fixed_s + self.per_tile_s * n_tiles + self.per_task_s * n_tasks

    @classmethod
    def fit(cls, workers: int, points) -> "HostCost":
        p = np.asarray(points, dtype=np.float64)
        x = np.stack([np.ones(len(p)), p[:, 0], p[:, 1]], axis=1)
        w = 1.0 / p[:, 2]  # relative error: small and large graphs weigh alike
        scale = x.max(axis=0)
        c, _ = nnls((x / scale) * w[:, None], np.ones(len(p)))
        c = c / scale
        return cls(workers, float(c[0]), float(c[1]), float(c[2]), p.tolist())


def _path(machine) -> str:
    from tilecast.perfmodel.calibration import tilecast_home

    return os.path.join(tilecast_home(), "calibration", f"host-{machine.name}-{machine.fingerprint()}.json")


def load_host_costs(machine) -> dict:
    try:
        with open(_path(machine)) as f:
            doc = json.load(f)
        if doc.get("format") != FORMAT:
            return {}
        return {int(w): HostCost(**h) for w, h in doc["fits"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def save_host_costs(machine, fits: dict) -> str:
    path = _path(machine)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"format": FORMAT, "machine": machine.name, "fingerprint": machine.fingerprint(),
                   "fits": {str(w): asdict(h) for w, h in fits.items()}}, f, indent=1)
    os.replace(tmp, path)
    return path


def measure_dry(workers: int, probes=PROBES, repeats: int = 5, sched: str = PROBE_SCHED, progress=None) -> list:
    """[tiles, tasks, median seconds] of dry runs of each probe step (after one warm-up run)."""
    from tilecast.executor.starpu_session import StarPUSession
    from tilecast.executor.step import TrainState, init_gpt2_params, load_step
    from tilecast.graph import Tiling
    from tilecast.graph.gpt2 import build_gpt2_step
    from tilecast.graph.model_config import load_model

    points = []
    with StarPUSession(sched, workers) as session:
        for name, batch, seq, tile in probes:
            cfg = load_model(name)
            graph = build_gpt2_step(cfg, batch, seq, Tiling.parse(tile))
            ids = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(batch, seq + 1))
            store = load_step(graph, TrainState(init_gpt2_params(cfg, 0)), ids[:, :-1], ids[:, 1:])
            times = []
            for _ in range(repeats + 1):
                t0 = time.perf_counter()
                session.execute(graph, store, dry=True)
                times.append(time.perf_counter() - t0)
                if progress:
                    progress()
            points.append([graph.n_tiles, graph.n_tasks, float(np.median(times[1:]))])
    return points


def ensure_host_costs(machine, worker_counts, progress: bool = True) -> dict:
    """Host cost fits for every worker count, measured (and stored) for those not stored yet."""
    fits = load_host_costs(machine)
    todo = [w for w in worker_counts if w not in fits]
    if not todo:
        return fits
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(todo) * len(PROBES) * 6, desc="measuring StarPU's per-step cost", unit="run",
                   file=sys.stderr, leave=False)
    try:
        for w in todo:
            fits[w] = HostCost.fit(w, measure_dry(w, progress=(lambda: bar.update(1)) if bar else None))
    finally:
        if bar is not None:
            bar.close()
    save_host_costs(machine, fits)
    return fits
