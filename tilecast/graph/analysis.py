"""Figures of a task graph: work per kernel, critical path, peak live memory."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tilecast.graph.graph import Graph
from tilecast.kernels import all_kernels


def kernel_table(graph: Graph) -> pd.DataFrame:
    """Tasks, flops and bytes per kernel, most flops first."""
    names = np.array([k.name for k in all_kernels()])
    df = pd.DataFrame({"kernel": names[graph.kernel], "flops": graph.flops, "bytes": graph.bytes})
    table = df.groupby("kernel").agg(tasks=("flops", "size"), flops=("flops", "sum"), bytes=("bytes", "sum"))
    return table.sort_values(["flops", "tasks"], ascending=False).reset_index()


def critical_path(graph: Graph, weights: np.ndarray | None = None, progress=None) -> float:
    """Length of the heaviest dependency chain, weighting each task by ``weights`` (default: flops).

    Tasks are in submission order, which is a topological order, so one pass suffices.
    """
    w = (graph.flops if weights is None else np.asarray(weights, dtype=np.float64)).tolist()
    ptr, pred = graph.dependencies
    ptr, pred = ptr.tolist(), pred.tolist()
    n = graph.n_tasks
    cp = [0.0] * n
    get = cp.__getitem__
    step = 100_000
    for start in range(0, n, step):
        for i in range(start, min(n, start + step)):
            a, b = ptr[i], ptr[i + 1]
            cp[i] = (max(map(get, pred[a:b])) if b > a else 0.0) + w[i]
        if progress is not None:
            progress(min(step, n - start))
    return max(cp, default=0.0)


def live_bytes(graph: Graph) -> int:
    """Peak memory of the step's live tiles when tasks run in submission order.

    Persistent tensors (inputs, parameters, gradients, optimizer states, loss)
    count for the whole step; any other tile from its first to its last access.
    """
    persistent = graph.persistent_tiles()
    nbytes = graph.tile_nbytes
    base = int(nbytes[persistent].sum())
    if graph.n_tasks == 0:
        return base
    first = np.full(graph.n_tiles, graph.n_tasks, dtype=np.int64)
    last = np.full(graph.n_tiles, -1, dtype=np.int64)
    np.minimum.at(first, graph.acc_tile, graph.access_task)
    np.maximum.at(last, graph.acc_tile, graph.access_task)
    used = (~persistent) & (last >= 0)
    delta = np.zeros(graph.n_tasks + 1, dtype=np.int64)
    np.add.at(delta, first[used], nbytes[used])
    np.add.at(delta, last[used] + 1, -nbytes[used])
    return base + int(np.cumsum(delta).max())


def summary(graph: Graph, progress=None) -> dict:
    """The figures ``tilecast graph`` prints; JSON-ready."""
    table = kernel_table(graph)
    return {
        "tasks": int(graph.n_tasks),
        "tiles": int(graph.n_tiles),
        "flops": float(graph.flops.sum()),
        "bytes": int(graph.bytes.sum()),
        "live_bytes": live_bytes(graph),
        "critical_path_flops": critical_path(graph, progress=progress),
        "kernels": {r.kernel: {"tasks": int(r.tasks), "flops": float(r.flops), "bytes": int(r.bytes)}
                    for r in table.itertuples()},
    }
