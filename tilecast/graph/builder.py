"""Incremental, vectorised construction of a task graph.

Model builders add whole operations at once: each :meth:`GraphBuilder.add`
call appends a batch of tasks of one kernel whose tiles and parameters are
numpy arrays, so building costs numpy time per operation, not Python time per
task.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from tilecast.graph.graph import Graph
from tilecast.graph.tensor import KINDS, Tensor
from tilecast.graph.tiling import Tiling
from tilecast.kernels import get
from tilecast.kernels.registry import RW, W


class GraphBuilder:
    def __init__(self, tiling: Tiling, meta: dict | None = None, dtype=np.float32):
        self.tiling = tiling
        self.dtype = np.dtype(dtype)
        self.meta = dict(meta or {})
        self.tensors: list[Tensor] = []
        self.tensors_by_name: dict[str, Tensor] = {}
        self._n_tiles = 0
        self._written = np.zeros(0, dtype=bool)
        self._batches: list[tuple] = []
        self._tags: dict[str, int] = {}
        self._tag = self._tag_id("")

    # --- tensors -----------------------------------------------------------
    def tensor(self, name: str, shape, dims, kind: str, dtype=None, tiles: dict | None = None) -> Tensor:
        """Declare a tensor; ``dims`` gives each axis's tiling dimension or None.

        ``dtype`` defaults to the builder's floating-point type.
        ``tiles`` overrides the tiling's size for some dimensions of this tensor.
        """
        if name in self.tensors_by_name:
            raise ValueError(f"tensor {name!r} declared twice")
        if kind not in KINDS:
            raise ValueError(f"unknown tensor kind {kind!r}")
        shape = tuple(int(s) for s in shape)
        tiling = Tiling({**self.tiling.sizes, **tiles}) if tiles else self.tiling
        tile = tuple(tiling.tile(d, n) if d else n for d, n in zip(dims, shape))
        dtype = self.dtype if dtype is None else np.dtype(dtype)
        t = Tensor(name, shape, tuple(dims), tile, dtype, kind, self._n_tiles, len(self.tensors))
        self.tensors.append(t)
        self.tensors_by_name[name] = t
        self._n_tiles += t.n_tiles
        if kind in ("input", "param", "optim"):
            self._mark_written(np.arange(t.first_tile, t.first_tile + t.n_tiles))
        return t

    def _grow_written(self) -> None:
        """Make the per-tile 'written' flags cover every tile declared so far."""
        if len(self._written) < self._n_tiles:
            grown = np.zeros(max(self._n_tiles, 2 * len(self._written)), dtype=bool)
            grown[: len(self._written)] = self._written
            self._written = grown

    def _mark_written(self, tiles: np.ndarray) -> None:
        self._grow_written()
        self._written[tiles] = True

    # --- tags --------------------------------------------------------------
    def _tag_id(self, tag: str) -> int:
        if tag not in self._tags:
            self._tags[tag] = len(self._tags)
        return self._tags[tag]

    @contextmanager
    def tagged(self, tag: str):
        """Tasks added inside the block carry ``tag`` (layer/phase)."""
        old = self._tag
        self._tag = self._tag_id(tag)
        try:
            yield
        finally:
            self._tag = old

    # --- tasks -------------------------------------------------------------
    def accumulate(self, tiles) -> tuple[np.ndarray, np.ndarray]:
        """(beta, mode) for a batch that accumulates into ``tiles``, in batch order.

        A tile's first contribution overwrites (beta 0, mode W); later ones add
        (beta 1, mode RW). Tiles already written earlier in the graph only add.
        """
        tiles = np.asarray(tiles, dtype=np.int64)
        self._grow_written()
        _, first_idx = np.unique(tiles, return_index=True)
        first = np.zeros(len(tiles), dtype=bool)
        first[first_idx] = True
        first &= ~self._written[tiles]
        self._written[tiles] = True
        return np.where(first, 0.0, 1.0), np.where(first, W, RW).astype(np.int8)

    def unwritten(self, tensor: Tensor) -> np.ndarray:
        """Tile ids of a tensor that no task has written yet."""
        self._grow_written()
        ids = np.arange(tensor.first_tile, tensor.first_tile + tensor.n_tiles)
        return ids[~self._written[ids]]

    def add(self, kernel: str, tiles, params: dict, modes=None) -> int:
        """Append a batch of tasks of one kernel; returns the number added.

        ``tiles`` lists one tile-id array (or scalar) per kernel buffer,
        ``params`` maps every kernel parameter to an array or scalar, and
        ``modes`` optionally overrides buffers' access modes (a mode or an
        array per buffer, None to keep the registry's).
        """
        k = get(kernel)
        if len(tiles) != len(k.buffers):
            raise ValueError(f"{kernel}: {len(k.buffers)} buffers expected, got {len(tiles)}")
        if params.keys() != set(k.params):
            missing, extra = set(k.params) - set(params), set(params) - set(k.params)
            raise ValueError(f"{kernel}: parameters missing {sorted(missing)}, unexpected {sorted(extra)}")
        if modes is not None and len(modes) != len(k.buffers):
            raise ValueError(f"{kernel}: {len(k.buffers)} modes expected, got {len(modes)}")
        modes = k.modes if modes is None else [k.modes[j] if m is None else m for j, m in enumerate(modes)]
        sizes = set()

        def column(v, dtype):
            """A Python number as it is (a batch of one broadcasts), anything else as a flat array."""
            if isinstance(v, (int, float)):
                return v
            a = np.asarray(v, dtype=dtype).ravel()
            sizes.add(a.size)
            return a

        arrays = [column(t, np.int64) for t in tiles]
        pvals = [column(params[name], np.float64) for name in k.params]
        mode_arrays = [column(m, np.int8) for m in modes]
        n = max(sizes, default=1)
        if sizes - {1, n}:
            raise ValueError(f"{kernel}: batch arrays of different lengths {sorted(sizes)}")
        if n == 0:
            return 0
        # Column assignment broadcasts a length-1 array (or a number) over the batch.
        tile_mat = np.empty((n, len(arrays)), dtype=np.int32)
        for j, a in enumerate(arrays):
            tile_mat[:, j] = a
        mode_mat = np.empty((n, len(arrays)), dtype=np.int8)
        for j, m in enumerate(mode_arrays):
            mode_mat[:, j] = m
        param_mat = np.empty((n, len(pvals)), dtype=np.float64)
        for j, v in enumerate(pvals):
            param_mat[:, j] = v
        self._batches.append((k.id, self._tag, tile_mat, mode_mat, param_mat))
        return n

    # --- result ------------------------------------------------------------
    def build(self) -> Graph:
        batches = self._batches
        counts = np.array([b[2].shape[0] for b in batches], dtype=np.int64)
        n_acc = np.array([b[2].shape[1] for b in batches], dtype=np.int64)
        n_par = np.array([b[4].shape[1] for b in batches], dtype=np.int64)
        kernel = np.repeat(np.array([b[0] for b in batches], dtype=np.int16), counts)
        tag = np.repeat(np.array([b[1] for b in batches], dtype=np.int32), counts)
        acc_ptr = np.zeros(len(kernel) + 1, dtype=np.int64)
        np.cumsum(np.repeat(n_acc, counts), out=acc_ptr[1:])
        param_ptr = np.zeros(len(kernel) + 1, dtype=np.int64)
        np.cumsum(np.repeat(n_par, counts), out=param_ptr[1:])
        acc_tile = np.concatenate([b[2].ravel() for b in batches]) if batches else np.zeros(0, np.int32)
        acc_mode = np.concatenate([b[3].ravel() for b in batches]) if batches else np.zeros(0, np.int8)
        params = np.concatenate([b[4].ravel() for b in batches]) if batches else np.zeros(0)
        self._batches = []
        n_tiles = np.array([t.n_tiles for t in self.tensors], dtype=np.int64)
        tile_tensor = np.repeat(np.arange(len(self.tensors), dtype=np.int32), n_tiles)
        tile_nbytes = np.concatenate(
            [t._elements for t in self.tensors]
        ).astype(np.int64) if self.tensors else np.zeros(0, np.int64)
        tile_nbytes *= np.repeat(np.array([t.dtype.itemsize for t in self.tensors], dtype=np.int64), n_tiles)
        tags = [None] * len(self._tags)
        for name, i in self._tags.items():
            tags[i] = name
        return Graph(
            tensors=self.tensors,
            tile_tensor=tile_tensor,
            tile_nbytes=tile_nbytes,
            kernel=kernel,
            tag=tag,
            tags=tags,
            param_ptr=param_ptr,
            params=params,
            acc_ptr=acc_ptr,
            acc_tile=acc_tile,
            acc_mode=acc_mode,
            meta=self.meta,
        )
