"""The task graph: tasks in submission order over tiles of tensors.

Stored as flat numpy arrays (structure of arrays) so that millions of tasks fit
in memory: per task a kernel id, a tag id, a slice of a parameter vector and a
slice of an access list (tile id + mode).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from tilecast.graph.deps import infer_dependencies
from tilecast.graph.tensor import PERSISTENT, Tensor
from tilecast.kernels import all_kernels
from tilecast.kernels.registry import MODE_NAMES, access_bytes


class _ParamColumns(Mapping):
    """A kernel's parameters by name for some of its tasks, each column gathered when read."""

    def __init__(self, params: np.ndarray, starts: np.ndarray, names: tuple):
        self._params, self._starts, self._names = params, starts, names
        self._index = {n: j for j, n in enumerate(names)}

    def __getitem__(self, name: str) -> np.ndarray:
        return self._params[self._starts + self._index[name]]

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


@dataclass
class TaskView:
    """One task, unpacked for reading (not for hot loops)."""

    id: int
    kernel: str
    params: dict
    tiles: list
    modes: list
    tag: str


@dataclass
class Graph:
    tensors: list[Tensor]
    tile_tensor: np.ndarray
    tile_nbytes: np.ndarray
    kernel: np.ndarray
    tag: np.ndarray
    tags: list[str]
    param_ptr: np.ndarray
    params: np.ndarray
    acc_ptr: np.ndarray
    acc_tile: np.ndarray
    acc_mode: np.ndarray
    meta: dict = field(default_factory=dict)

    # --- sizes -------------------------------------------------------------
    @property
    def n_tasks(self) -> int:
        return len(self.kernel)

    @property
    def n_tiles(self) -> int:
        return len(self.tile_tensor)

    def __len__(self) -> int:
        return self.n_tasks

    @cached_property
    def _tensor_index(self) -> dict:
        return {t.name: t for t in self.tensors}

    def tensor(self, name: str) -> Tensor:
        try:
            return self._tensor_index[name]
        except KeyError:
            raise KeyError(f"no tensor {name!r} in the graph") from None

    # --- tasks -------------------------------------------------------------
    def task(self, i: int) -> TaskView:
        k = all_kernels()[self.kernel[i]]
        p = self.params[self.param_ptr[i]:self.param_ptr[i + 1]]
        a, b = self.acc_ptr[i], self.acc_ptr[i + 1]
        return TaskView(
            id=int(i),
            kernel=k.name,
            params=dict(zip(k.params, p.tolist())),
            tiles=self.acc_tile[a:b].tolist(),
            modes=[MODE_NAMES[int(m)] for m in self.acc_mode[a:b]],
            tag=self.tags[self.tag[i]],
        )

    @cached_property
    def _tasks_by_kernel(self) -> tuple[np.ndarray, np.ndarray]:
        """(task ids sorted by kernel, then id; start of each kernel's run): one sort instead of a
        comparison over every task per kernel."""
        order = np.argsort(self.kernel, kind="stable")
        bounds = np.zeros(len(all_kernels()) + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.kernel, minlength=len(all_kernels())), out=bounds[1:])
        return order, bounds

    def kernel_params(self, kernel_id: int) -> tuple[np.ndarray, np.ndarray]:
        """Task ids of one kernel (increasing) and their parameters as an (n, n_params) matrix."""
        order, bounds = self._tasks_by_kernel
        ids = order[bounds[kernel_id]:bounds[kernel_id + 1]]
        n_params = len(all_kernels()[kernel_id].params)
        cols = self.param_ptr[ids][:, None] + np.arange(n_params)
        return ids, self.params[cols]

    def set_param(self, kernel_name: str, param: str, value: float) -> None:
        """Set one scalar parameter on every task of a kernel (e.g. AdamW's step)."""
        k = next(k for k in all_kernels() if k.name == kernel_name)
        ids = np.flatnonzero(self.kernel == k.id)
        self.params[self.param_ptr[ids] + k.params.index(param)] = value

    # --- derived per-task figures -----------------------------------------
    @cached_property
    def flops(self) -> np.ndarray:
        """Floating-point operations of every task, from the registry's formulas."""
        out = np.zeros(self.n_tasks, dtype=np.float64)
        order, bounds = self._tasks_by_kernel
        for k in all_kernels():
            ids = order[bounds[k.id]:bounds[k.id + 1]]
            if len(ids):  # only the parameters the formula reads are gathered
                out[ids] = k.flops(_ParamColumns(self.params, self.param_ptr[ids], k.params))
        return out

    @cached_property
    def bytes(self) -> np.ndarray:
        """Bytes each task reads and writes, by the registry's formula (:func:`access_bytes`)."""
        per_access = access_bytes(self.tile_nbytes[self.acc_tile], self.acc_mode)
        return np.add.reduceat(per_access, self.acc_ptr[:-1]) if self.n_tasks else np.zeros(0)

    @cached_property
    def dependencies(self) -> tuple[np.ndarray, np.ndarray]:
        """(pred_ptr, pred): each task's direct predecessors, as the runtime infers them."""
        return infer_dependencies(self.acc_ptr, self.acc_tile, self.acc_mode)

    def predecessors(self, i: int) -> np.ndarray:
        ptr, pred = self.dependencies
        return pred[ptr[i]:ptr[i + 1]]

    @cached_property
    def access_task(self) -> np.ndarray:
        """The task of every access (parallel to acc_tile)."""
        return np.repeat(np.arange(self.n_tasks, dtype=np.int64), np.diff(self.acc_ptr))

    def persistent_tiles(self) -> np.ndarray:
        """Boolean per tile: does it live for the whole step (inputs, parameters, states)?"""
        kinds = np.array([t.kind in PERSISTENT for t in self.tensors])
        return kinds[self.tile_tensor]
