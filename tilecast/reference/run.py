"""Sequential reference execution of a graph with the registry's numpy kernels."""

from __future__ import annotations

import numpy as np

from tilecast.reference.tiles import TileStore
from tilecast.graph import Graph
from tilecast.kernels import all_kernels


class ExecutionError(RuntimeError):
    """A graph that cannot be executed as built (e.g. a tile read before any write)."""


def run_reference(graph: Graph, store: TileStore, xp=np, free_activations: bool = True, progress=None) -> None:
    """Execute every task in submission order, in place on ``store``'s buffers.

    Tiles are allocated on their first write; with ``free_activations``,
    non-persistent tiles are released after their last access.
    ``progress`` is an optional callable taking the number of tasks just done.
    """
    kernels = all_kernels()
    kernel, acc_ptr, acc_tile, acc_mode = graph.kernel, graph.acc_ptr, graph.acc_tile, graph.acc_mode
    params, param_ptr = graph.params, graph.param_ptr
    bufs = store.buffers
    shapes = _tile_sizes(graph)
    dtypes = [graph.tensors[t].dtype for t in graph.tile_tensor.tolist()]
    last_use = _last_access(graph) if free_activations else None
    persistent = graph.persistent_tiles()
    acc_list, mode_list = acc_tile.tolist(), acc_mode.tolist()
    ptr = acc_ptr.tolist()
    for i in range(graph.n_tasks):
        k = kernels[kernel[i]]
        args = []
        for j in range(ptr[i], ptr[i + 1]):
            t = acc_list[j]
            buf = bufs[t]
            if buf is None:
                if mode_list[j] & 1:
                    tensor = graph.tensors[graph.tile_tensor[t]]
                    raise ExecutionError(
                        f"task {i} ({k.name}) reads tile {t - tensor.first_tile} of {tensor.name!r} before it is written")
                buf = bufs[t] = xp.empty(shapes[t], dtype=dtypes[t])
            args.append(buf)
        k.reference(xp, args, k.unpack(params[param_ptr[i]:param_ptr[i + 1]]))
        if last_use is not None:
            for j in range(ptr[i], ptr[i + 1]):
                t = acc_list[j]
                if last_use[t] == i and not persistent[t]:
                    bufs[t] = None
        if progress is not None and (i + 1) % 1000 == 0:
            progress(1000)
    if progress is not None:
        progress(graph.n_tasks % 1000)


def _tile_sizes(graph: Graph) -> list[int]:
    return (graph.tile_nbytes // np.array([t.dtype.itemsize for t in graph.tensors])[graph.tile_tensor]).tolist()


def _last_access(graph: Graph) -> np.ndarray:
    last = np.full(graph.n_tiles, -1, dtype=np.int64)
    np.maximum.at(last, graph.acc_tile, graph.access_task)
    return last
