"""The smallest main memory a step's graph can run in under StarPU's memory limit (its working set).

One rule for the executor, which refuses a limit below it before StarPU starts
(:mod:`tilecast.executor.memory_limit`), and the simulator's forecast of a
memory-limited step (:mod:`tilecast.simulator.memory_capacity`).
"""

from __future__ import annotations

import math

import numpy as np

MIB = 1 << 20
# StarPU takes its limit in whole MiB (STARPU_LIMIT_CPU_MEM) and rounds each allocation up a little.
SLACK_BYTES = 1 * MIB


def format_size(n: float) -> str:
    """Bytes as people read them, in binary units (``1.50 GiB``)."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def largest_task_bytes(graph) -> int:
    """Bytes of the distinct tiles the graph's largest task touches."""
    if not graph.n_tasks:
        return 0
    acc_ptr = np.asarray(graph.acc_ptr, dtype=np.int64)
    nbytes = np.asarray(graph.tile_nbytes, dtype=np.int64)[np.asarray(graph.acc_tile)]
    counts = np.diff(acc_ptr)
    per_task = np.add.reduceat(nbytes, acc_ptr[:-1][counts > 0]) if nbytes.size else np.zeros(1, np.int64)
    return int(per_task.max())


def tile_bytes(graphs) -> int:
    """Every tile's bytes over ``graphs`` (tiles shared between graphs are counted for each graph:
    an upper bound)."""
    return int(sum(int(np.asarray(g.tile_nbytes, dtype=np.int64).sum()) for g in graphs))


def minimum_bytes(graphs, workers: int, offload: bool) -> int:
    """The smallest working set of steps over ``graphs`` on ``workers`` workers: with a disk node (``offload``),
    workers x the largest task's tiles (each worker holds every tile of the task it runs) + the largest tile
    (the host acquires one tile at a time) + slack; without one, every tile."""
    if not offload:
        return tile_bytes(graphs)
    task = max(largest_task_bytes(g) for g in graphs)
    tile = max(int(np.max(g.tile_nbytes)) if g.n_tiles else 0 for g in graphs)
    return workers * task + tile + SLACK_BYTES


def refusal(graphs, workers: int, limit_bytes: int, offload: bool) -> str | None:
    """Why ``limit_bytes`` cannot run ``graphs`` on ``workers`` workers, in one line (None: it can): below the
    smallest working set (:func:`minimum_bytes`), which the line gives. StarPU takes the limit in whole MiB."""
    need = minimum_bytes(graphs, workers, offload)
    if (limit_bytes // MIB) * MIB >= need:
        return None
    where = (f"{workers} worker(s) x the largest task's buffers + the largest tile + slack" if offload
             else "every tile stays in memory without a disk node")
    return (f"{format_size(limit_bytes)} is below the step's smallest working set; the minimum is "
            f"{math.ceil(need / MIB)}MiB ({where})")
