"""Figures of a task graph: work per kernel, critical path, peak live memory."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tilecast.graph.graph import Graph
from tilecast.kernels import all_kernels

if TYPE_CHECKING:  # imported by kernel_table alone (0.4 s): a simulation needs none
    import pandas as pd


def kernel_table(graph: Graph) -> pd.DataFrame:
    """Tasks, flops and bytes per kernel, most flops first."""
    import pandas as pd

    names = [k.name for k in all_kernels()]
    kid = np.asarray(graph.kernel, dtype=np.int64)
    tasks = np.bincount(kid, minlength=len(names))
    used = np.flatnonzero(tasks)  # by kernel id: no per-task strings (2 M tasks in a fraction of a second)
    table = pd.DataFrame({"kernel": [names[i] for i in used], "tasks": tasks[used],
                          "flops": np.bincount(kid, weights=graph.flops, minlength=len(names))[used],
                          "bytes": np.bincount(kid, weights=graph.bytes, minlength=len(names))[used].astype(np.int64)})
    return table.sort_values(["flops", "tasks"], ascending=False).reset_index(drop=True)


def longest_path_end(weights, pred_ptr: np.ndarray, pred: np.ndarray, progress=None) -> np.ndarray:
    """Earliest finish of every task with unlimited workers: its weight plus its latest predecessor's finish.

    Tasks are in submission order, a topological order, so one pass in id order
    suffices. Plain Python over lists (about 0.5 us per task): a level-by-level
    numpy version pays per level, and training-step graphs have thousands of levels.
    ``progress`` is an optional callable taking the number of tasks just done.
    """
    w = np.asarray(weights, dtype=np.float64).tolist()
    ptr, pr = np.asarray(pred_ptr).tolist(), np.asarray(pred).tolist()
    n = len(w)
    finish = [0.0] * n
    get = finish.__getitem__
    step = 100_000
    for start in range(0, n, step):
        for i in range(start, min(n, start + step)):
            a, b, wi = ptr[i], ptr[i + 1], w[i]
            if b - a == 2:  # the most common case in training-step graphs, without a slice
                x, y = finish[pr[a]], finish[pr[a + 1]]
                finish[i] = (x if x > y else y) + wi
            elif b - a == 1:
                finish[i] = finish[pr[a]] + wi
            else:
                finish[i] = (max(map(get, pr[a:b])) if b > a else 0.0) + wi
        if progress is not None:
            progress(min(step, n - start))
    return np.asarray(finish)


def critical_path(graph: Graph, weights: np.ndarray | None = None, progress=None, sweep=None) -> float:
    """Length of the heaviest dependency chain, weighting each task by ``weights`` (default: flops).

    ``sweep(weights, pred_ptr, pred)`` is an optional faster :func:`longest_path_end` (same result; None
    when it cannot run), such as the simulator's compiled one, which the command line passes.
    """
    ptr, pred = graph.dependencies
    weights = graph.flops if weights is None else weights
    finish = sweep(weights, ptr, pred) if sweep is not None else None
    if finish is None:
        finish = longest_path_end(weights, ptr, pred, progress)
    elif progress is not None:
        progress(len(finish))
    return float(finish.max()) if len(finish) else 0.0


def tile_lifetimes(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """(first, last): per tile, the first and the last task that touches it (``n_tasks`` and -1 for a tile
    no task touches). An executor that releases a non-persistent tile after task ``last`` keeps the peak
    :func:`live_memory` reports."""
    first = np.full(graph.n_tiles, graph.n_tasks, dtype=np.int64)
    last = np.full(graph.n_tiles, -1, dtype=np.int64)
    np.minimum.at(first, graph.acc_tile, graph.access_task)
    np.maximum.at(last, graph.acc_tile, graph.access_task)
    return first, last


def live_memory(graph: Graph) -> dict:
    """Peak memory of the step's live tiles when tasks run one at a time in submission order.

    Persistent tensors (inputs, parameters, gradients, optimizer states, loss)
    count for the whole step; any other tile (an activation or a temporary)
    from the task that first touches it, its first write, to the last task that
    touches it, its last read, both included. Returns ``peak_bytes``,
    ``persistent_bytes``, ``activation_peak_bytes`` (the peak less the
    persistent bytes), ``peak_task`` (the first task at which the peak is
    reached, -1 for an empty graph) and ``peak_tag`` (that task's tag).
    """
    persistent = graph.persistent_tiles()
    nbytes = graph.tile_nbytes
    base = int(nbytes[persistent].sum())
    if graph.n_tasks == 0:
        return dict(peak_bytes=base, persistent_bytes=base, activation_peak_bytes=0, peak_task=-1, peak_tag="")
    first, last = tile_lifetimes(graph)
    used = (~persistent) & (last >= 0)
    delta = np.zeros(graph.n_tasks + 1, dtype=np.int64)
    np.add.at(delta, first[used], nbytes[used])
    np.add.at(delta, last[used] + 1, -nbytes[used])
    live = np.cumsum(delta[:-1])
    at = int(np.argmax(live))
    return dict(peak_bytes=base + int(live[at]), persistent_bytes=base, activation_peak_bytes=int(live[at]),
                peak_task=at, peak_tag=graph.tags[graph.tag[at]])


def live_bytes(graph: Graph) -> int:
    """Peak memory of the step's live tiles in submission order (:func:`live_memory`'s ``peak_bytes``)."""
    return live_memory(graph)["peak_bytes"]


def _live_keys(live: dict) -> dict:
    return {"live_bytes": live["peak_bytes"], "live_persistent_bytes": live["persistent_bytes"],
            "live_activation_bytes": live["activation_peak_bytes"], "live_peak_tag": live["peak_tag"]}


def summary(graph: Graph, progress=None, sweep=None) -> dict:
    """The figures ``tilecast graph`` prints; JSON-ready. ``sweep``: see :func:`critical_path`."""
    table = kernel_table(graph)
    return {
        "tasks": int(graph.n_tasks),
        "tiles": int(graph.n_tiles),
        "flops": float(graph.flops.sum()),
        "bytes": int(graph.bytes.sum()),
        **_live_keys(live_memory(graph)),
        "critical_path_flops": critical_path(graph, progress=progress, sweep=sweep),
        "kernels": {r.kernel: {"tasks": int(r.tasks), "flops": float(r.flops), "bytes": int(r.bytes)}
                    for r in table.itertuples()},
    }
