"""Kernel models from StarPU's own history-based performance-model files.

StarPU (1.3, ``STARPU_HISTORY_BASED`` models) keeps, per codelet symbol and
host, a file ``$STARPU_HOME/.starpu/sampling/codelets/<version>/<symbol>.<host>``
with, for every device combination, rows ``hash size flops mean(us) dev(us)
sum sum2 n``: ``size`` is the total bytes of the task's data and ``hash`` a
footprint of the data layout. tilecast's codelets are named after the kernels,
so a kernel's rows are matched to a graph's task shapes by total data size
(rows of the same size are pooled, weighted by their sample counts).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from tilecast.kernels import all_kernels
from tilecast.perfmodel.calibration import STARPU_HISTORY, Calibration
from tilecast.perfmodel.shapes import graph_shapes

CPU_DEVICE = 0  # StarPU device type codes: CPU 0, CUDA 1, OpenCL 2


@dataclass
class HistoryRow:
    device: int
    size: int
    mean_s: float
    dev_s: float
    n: int


def read_history(path: str) -> list[HistoryRow]:
    """Rows of one StarPU history file, each tagged with the device type of its combination."""
    try:
        with open(path) as f:
            lines = [ln.rstrip("\n") for ln in f]
    except OSError as e:
        raise ValueError(f"{path}: cannot read StarPU performance model ({e.strerror})") from None
    rows, device, i = [], None, 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("# device type"):
            device = int(lines[i + 1].split()[0])
            i += 2
            continue
        if re.match(r"#\s*hash\s+size", line):
            i += 1
            while i < len(lines) and lines[i].strip() and not lines[i].startswith("#"):
                f = lines[i].split()
                if len(f) < 8:
                    raise ValueError(f"{path}: line {i + 1}: expected 8 columns (hash size flops mean dev sum sum2 n)")
                rows.append(HistoryRow(device if device is not None else CPU_DEVICE, int(f[1]), float(f[3]) * 1e-6,
                                       float(f[4]) * 1e-6, int(f[7])))
                i += 1
            continue
        i += 1
    return rows


def history_files(codelets_dir: str) -> dict[str, str]:
    """Kernel name -> history file in a ``sampling/codelets/<version>`` directory (newest version wins)."""
    known = {k.name for k in all_kernels()}
    out = {}
    if not os.path.isdir(codelets_dir):
        raise ValueError(f"{codelets_dir}: no such directory")
    dirs = [codelets_dir] + sorted((os.path.join(codelets_dir, d) for d in os.listdir(codelets_dir)
                                    if os.path.isdir(os.path.join(codelets_dir, d))), key=lambda d: os.path.basename(d))
    for d in dirs:
        for name in sorted(os.listdir(d)):
            symbol = name.rsplit(".", 1)[0]
            if symbol in known and os.path.isfile(os.path.join(d, name)):
                out[symbol] = os.path.join(d, name)
    return out


def calibration_from_history(codelets_dir: str, graph, machine, device: int = CPU_DEVICE,
                             kind: str | None = None) -> Calibration:
    """Calibration points for the task shapes of ``graph`` that StarPU's history has timed."""
    files = history_files(codelets_dir)
    cal = Calibration(machine.name, machine.fingerprint(), kind or machine.kind_names[0], STARPU_HISTORY)
    for ks in graph_shapes(graph):
        name = all_kernels()[ks.kernel].name
        if name not in files:
            continue
        by_size: dict[int, list] = {}
        for r in read_history(files[name]):
            if r.device == device and r.n > 0:
                by_size.setdefault(r.size, []).append(r)
        totals = ks.nbytes.sum(axis=1).astype(np.int64)
        for row, total in zip(ks.shapes, totals.tolist()):
            hits = by_size.get(total)
            if not hits:
                continue
            n = np.array([h.n for h in hits], dtype=np.float64)
            mean = float(np.dot(n, [h.mean_s for h in hits]) / n.sum())
            cal.add(name, row, mean, float(np.dot(n, [h.dev_s for h in hits]) / n.sum()))
    return cal
