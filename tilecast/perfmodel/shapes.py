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


def graph_shapes(graph) -> list[KernelShapes]:
    """Distinct shapes per kernel of a graph (kernels without tasks are left out)."""
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
