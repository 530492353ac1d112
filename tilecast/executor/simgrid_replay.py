"""A graph simulated by StarPU itself, in SimGrid mode, from the history files of the real runs.

:func:`export_graph` writes what StarPU needs to submit a graph as the glue
does (``c/simgrid_replay.c`` documents the format): kernel names (the
codelets' performance-model symbols), every tile's element count and size
(the vector handles, hence the footprints), the tasks' kernels, accesses and
priorities. :func:`simgrid_makespans` runs the replay program (built by
:mod:`tilecast.executor.simgrid_build`) on it with a policy and a worker
count, against a copy of ``$STARPU_HOME/.starpu/sampling`` (codelet histories
and the bus calibration, whose ``<host>.platform.xml`` is SimGrid's platform)
under the host name the real runs used: task durations are the history
means of their footprints, as StarPU itself would predict them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tilecast.kernels import all_kernels

MAGIC = "tilecast-graph 1"


def tile_layout(graph) -> tuple[np.ndarray, np.ndarray]:
    """(element count, element size) of every tile, as the executor registers it (vector handles)."""
    itemsize = np.array([t.dtype.itemsize for t in graph.tensors], dtype=np.int64)[graph.tile_tensor]
    nbytes = np.asarray(graph.tile_nbytes, dtype=np.int64)
    if np.any(nbytes % itemsize):
        raise ValueError("a tile's size is not a whole number of elements")
    return nbytes // itemsize, itemsize


def export_graph(graph, path, priority=None) -> Path:
    """Write ``graph`` for the replay program; ``priority``: per-task StarPU priorities (int32) or None."""
    kernels = all_kernels()
    nelem, elemsize = tile_layout(graph)
    n = graph.n_tasks
    head = [MAGIC, f"kernels {len(kernels)}"] + [f"{k.name} {len(k.buffers)}" for k in kernels]
    head += [f"tiles {graph.n_tiles} tasks {n} accesses {len(graph.acc_tile)} priorities {int(priority is not None)}",
             "data"]
    arrays = [nelem.astype("<i8"), elemsize.astype("<i8"), np.asarray(graph.kernel).astype("<i2")]
    if priority is not None:
        priority = np.asarray(priority)
        if priority.shape != (n,):
            raise ValueError(f"priorities for {priority.shape[0]} tasks, the graph has {n}")
        arrays.append(priority.astype("<i4"))
    arrays += [np.asarray(graph.acc_ptr).astype("<i8"), np.asarray(graph.acc_tile).astype("<i4"),
               np.asarray(graph.acc_mode).astype("<i1")]
    path = Path(path)
    with open(path, "wb") as f:
        f.write(("\n".join(head) + "\n").encode())
        for a in arrays:
            f.write(np.ascontiguousarray(a).tobytes())
    return path


def read_export(path) -> dict:
    """The arrays of an exported graph (the inverse of :func:`export_graph`, for checks)."""
    data = Path(path).read_bytes()
    end = data.index(b"\ndata\n") + len(b"\ndata\n")
    lines = data[:end].decode().splitlines()
    if lines[0] != MAGIC:
        raise ValueError(f"{path}: not a tilecast graph export")
    nk = int(lines[1].split()[1])
    names = [ln.split()[0] for ln in lines[2:2 + nk]]
    c = lines[2 + nk].split()
    t, n, a, p = int(c[1]), int(c[3]), int(c[5]), int(c[7])
    out, pos = {"kernels": names}, end
    spec = [("nelem", "<i8", t), ("elemsize", "<i8", t), ("kernel", "<i2", n)]
    spec += [("priority", "<i4", n)] if p else []
    spec += [("acc_ptr", "<i8", n + 1), ("acc_tile", "<i4", a), ("acc_mode", "<i1", a)]
    for name, dt, count in spec:
        out[name] = np.frombuffer(data, dtype=dt, count=count, offset=pos)
        pos += count * np.dtype(dt).itemsize
    if pos != len(data):
        raise ValueError(f"{path}: {len(data) - pos} trailing bytes")
    out["priority"] = out.get("priority")
    return out


def default_priorities(graph, sched: str):
    """The priorities the executor gives StarPU by default for ``graph`` under ``sched`` (None: all 0)."""
    from tilecast.executor.starpu_execute import local_priority_weights
    from tilecast.graph.priorities import (
        USES_PRIORITIES,
        bottom_level,
        priority_range,
        starpu_priorities,
    )

    if sched not in USES_PRIORITIES:
        return None
    pred_ptr, pred = graph.dependencies
    lo, hi = priority_range(sched)
    return starpu_priorities(bottom_level(local_priority_weights(graph), pred_ptr, pred), lo, hi).astype(np.int32)


def starpu_hostname() -> str:
    """The host name StarPU files its models under (``$STARPU_HOSTNAME``, else the name up to its first dot)."""
    return os.environ.get("STARPU_HOSTNAME") or socket.gethostname().split(".")[0]


@dataclass
class SimGridRun:
    makespans_s: list
    workers: int
    wall_s: float  # the replay program's wall time: StarPU's start, the simulation of every step, shutdown
    warnings: list = field(default_factory=list)  # StarPU's messages (e.g. footprints with few samples)
    worker_tasks: list = field(default_factory=list)  # per worker, the tasks it ran in the last step
    worker_busy_s: list = field(default_factory=list)  # per worker, the sum of their simulated execution times

    @property
    def makespan_s(self) -> float:
        return float(np.median(self.makespans_s))


def _sampling_copy(starpu_home: Path, dest: Path, hostname: str) -> None:
    src = Path(starpu_home) / ".starpu" / "sampling"
    platform = src / "bus" / f"{hostname}.platform.xml"
    if not platform.is_file():
        raise FileNotFoundError(f"{platform}: no platform description for host {hostname!r}; StarPU writes it "
                                f"when it calibrates the bus on its first real run here")
    if not (src / "codelets").is_dir():
        raise FileNotFoundError(f"{src / 'codelets'}: no performance-model histories; run the graph on StarPU first")
    shutil.copytree(src, dest / ".starpu" / "sampling")


def simgrid_makespans(graph, sched: str, workers: int, starpu_home, steps: int = 1, priority="default",
                      exe=None, timeout_s: float = 3600.0) -> SimGridRun:
    """Simulate ``graph`` on StarPU-with-SimGrid under ``sched`` with ``workers`` CPU workers, ``steps``
    times in one StarPU session, from the models in ``starpu_home`` (a copy: StarPU's files there are
    not touched). ``priority``: "default" (:func:`default_priorities`), None, or per-task priorities."""
    from tilecast.executor.simgrid_build import ensure_replay

    exe = exe or ensure_replay()
    host = starpu_hostname()
    if isinstance(priority, str):
        priority = default_priorities(graph, sched)
    with tempfile.TemporaryDirectory(prefix="tilecast-simgrid-") as tmp:
        tmp = Path(tmp)
        _sampling_copy(Path(starpu_home), tmp, host)
        export_graph(graph, tmp / "graph.bin", priority)
        env = dict(os.environ, STARPU_HOME=str(tmp), STARPU_HOSTNAME=host, STARPU_SCHED=sched,
                   STARPU_NCPU=str(workers))
        for var in ("STARPU_PERF_MODEL_DIR", "STARPU_CALIBRATE", "STARPU_BUS_CALIBRATE"):
            env.pop(var, None)
        t0 = time.perf_counter()
        res = subprocess.run([str(exe), str(tmp / "graph.bin"), sched, str(workers), str(steps)], env=env,
                             capture_output=True, text=True, timeout=timeout_s, cwd=tmp)
        wall = time.perf_counter() - t0
    if res.returncode != 0:
        tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-8:])
        raise RuntimeError(f"the SimGrid replay failed (exit {res.returncode}):\n{tail}")
    lines = res.stdout.split("\n")
    makespans = [float(ln.split()[1]) for ln in lines if ln.startswith("makespan_s ")]
    nworkers = next((int(ln.split()[1]) for ln in lines if ln.startswith("workers ")), 0)
    if len(makespans) != steps:
        raise RuntimeError(f"the SimGrid replay printed {len(makespans)} makespans, expected {steps}:\n{res.stdout}")
    warnings = [ln for ln in res.stderr.splitlines() if ln.strip()]
    per_worker = [ln.split() for ln in lines if ln.startswith("worker ")][-nworkers:] if nworkers else []
    return SimGridRun(makespans, nworkers, wall, warnings, [int(f[3]) for f in per_worker],
                      [float(f[5]) for f in per_worker])
