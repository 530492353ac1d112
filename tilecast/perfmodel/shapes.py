"""Task shapes: what a kernel's duration depends on, deduplicated over a graph.

A task's *shape* is its kernel's scalar parameters followed by the byte size of
each of its buffers. A training step of millions of tasks has only hundreds of
distinct shapes, so models are evaluated once per shape and scattered back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tilecast.kernels import all_kernels


@dataclass
class KernelShapes:
    """The distinct shapes of one kernel's tasks in a graph."""

    kernel: int
    tasks: np.ndarray  # task ids of this kernel
    shapes: np.ndarray  # (n_unique, n_params + n_buffers) float64
    inverse: np.ndarray  # per task of ``tasks``, its row of ``shapes``
    n_params: int

    @property
    def params(self) -> np.ndarray:
        return self.shapes[:, :self.n_params]

    @property
    def nbytes(self) -> np.ndarray:
        return self.shapes[:, self.n_params:]


# graphs up to this many tasks are deduplicated by one sort (shapes_one_sort), larger ones kernel by kernel:
# one sort saves the per-kernel fixed costs, but sorts every task by the widest kernel's columns (2026-12-01,
# the 2-core AMD EPYC, loaded, fastest of 3: 490 tasks 0.37 ms against 0.93, 1,551 0.76 against 2.03, 2,342
# 1.07 against 0.98, 13,402 12.1 against 6.4)
ONE_SORT_TASKS = 2_000


def graph_shapes(graph) -> list[KernelShapes]:
    """Distinct shapes per kernel of a graph (kernels without tasks are left out)."""
    if graph.n_tasks <= ONE_SORT_TASKS:
        return shapes_one_sort(graph)
    return shapes_per_kernel(graph)


def shapes_per_kernel(graph) -> list[KernelShapes]:
    """:func:`graph_shapes` by one :func:`unique_rows` per kernel."""
    out = []
    kernels = all_kernels()
    present = np.bincount(graph.kernel, minlength=len(kernels)) > 0  # most kernels have no task in a graph
    for k in kernels:
        if not present[k.id]:
            continue
        ids, p = graph.kernel_params(k.id)
        nb = len(k.buffers)
        tiles = graph.acc_tile[graph.acc_ptr[ids][:, None] + np.arange(nb)]
        mat = np.concatenate([p, graph.tile_nbytes[tiles].astype(np.float64)], axis=1)
        shapes, inverse = unique_rows(mat)
        out.append(KernelShapes(k.id, ids, shapes, inverse, len(k.params)))
    return out


def shapes_one_sort(graph) -> list[KernelShapes]:
    """:func:`graph_shapes` by one sort over every task (kernel id first, then the kernel's shape,
    zero-padded to the widest kernel's): the same rows, order and inverse as :func:`shapes_per_kernel`
    without its fixed costs per kernel, most of a small graph's time (a graph holds a few dozen kernels)."""
    kernels = all_kernels()
    n = graph.n_tasks
    if n == 0:
        return []
    kid = np.asarray(graph.kernel, dtype=np.int64)
    n_par = np.array([len(k.params) for k in kernels], dtype=np.int64)
    n_buf = np.array([len(k.buffers) for k in kernels], dtype=np.int64)
    counts = np.bincount(kid, minlength=len(kernels))
    present = np.flatnonzero(counts)
    col = np.arange(int((n_par + n_buf)[present].max()))
    tp, tb = n_par[kid][:, None], n_buf[kid][:, None]
    is_p = col < tp
    is_b = ~is_p & (col < tp + tb)
    params = graph.params if len(graph.params) else np.zeros(1)
    tiles = graph.acc_tile if len(graph.acc_tile) else np.zeros(1, dtype=np.int64)
    p = params[np.where(is_p, graph.param_ptr[:n, None] + col, 0)]
    b = graph.tile_nbytes[tiles[np.where(is_b, graph.acc_ptr[:n, None] + col - tp, 0)]].astype(np.float64)
    mat = np.where(is_p, p, np.where(is_b, b, 0.0))
    order = np.lexsort((*mat.T[::-1], kid))
    ranked, rk = mat[order], kid[order]
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.any(ranked[1:] != ranked[:-1], axis=1, out=new[1:])
    new[1:] |= rk[1:] != rk[:-1]
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    rows, row_kernel = ranked[new], rk[new]
    first = np.searchsorted(row_kernel, present)
    last = np.searchsorted(row_kernel, present, side="right")
    by_kernel = np.argsort(kid, kind="stable")  # each kernel's tasks in increasing id
    start = np.concatenate([[0], np.cumsum(counts)])
    out = []
    for k, lo, hi in zip(present.tolist(), first.tolist(), last.tolist()):
        ids = by_kernel[start[k]:start[k + 1]]
        w = int(n_par[k] + n_buf[k])
        out.append(KernelShapes(k, ids, np.ascontiguousarray(rows[lo:hi, :w]), inverse[ids] - lo, int(n_par[k])))
    return out


def unique_rows(mat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(mat, axis=0, return_inverse=True)`` for rows of numbers without NaN (the same sorted rows
    and inverse), by one lexsort: several times faster on the few hundred rows of a graph's kernel."""
    if len(mat) == 0 or mat.shape[1] == 0:
        shapes, inverse = np.unique(mat, axis=0, return_inverse=True)
        return shapes, inverse.reshape(-1)
    order = np.lexsort(mat.T[::-1])
    ranked = mat[order]
    new = np.empty(len(mat), dtype=bool)
    new[0] = True
    np.any(ranked[1:] != ranked[:-1], axis=1, out=new[1:])
    inverse = np.empty(len(mat), dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    return ranked[new], inverse


def shape_flops(kernel_id: int, params: np.ndarray) -> np.ndarray:
    """Flops of shapes (rows of parameters) from the registry's formula."""
    k = all_kernels()[kernel_id]
    return np.asarray(k.flops({name: params[:, j] for j, name in enumerate(k.params)}), dtype=np.float64) \
        * np.ones(len(params))


def shape_bytes(kernel_id: int, nbytes: np.ndarray) -> np.ndarray:
    """Bytes read and written by shapes, by the registry's formula (buffer sizes, registry modes)."""
    return all_kernels()[kernel_id].bytes(nbytes)
