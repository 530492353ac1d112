"""Tensors of a task graph and their split into tiles."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache, reduce

import numpy as np

from tilecast.graph.tiling import tile_extents


@lru_cache(maxsize=4096)
def _layout(shape: tuple, tile: tuple) -> tuple:
    """(extents, starts, grid, tile count, elements per tile) of a tensor layout; the arrays read-only."""
    extents = tuple(tile_extents(n, t) for n, t in zip(shape, tile))
    starts = tuple(np.concatenate(([0], np.cumsum(e)[:-1])) for e in extents)
    elements = reduce(np.multiply.outer, extents, np.ones((), np.int64)).ravel()
    for a in extents + starts + (elements,):
        a.flags.writeable = False
    grid = tuple(len(e) for e in extents)
    return extents, starts, grid, math.prod(grid), elements


# What a tensor is for; persistent kinds live for the whole step.
KINDS = ("input", "param", "grad", "optim", "activation", "loss")
PERSISTENT = {"input", "param", "grad", "optim", "loss"}


@dataclass
class Tensor:
    """A tensor split into a grid of tiles; each tile is one contiguous row-major buffer.

    ``dims`` names, for each axis, the tiling dimension it follows (``None``:
    never tiled); ``tile`` gives the tile size actually used on each axis.
    Tiles are numbered row-major over the grid, from ``first_tile``.
    """

    name: str
    shape: tuple[int, ...]
    dims: tuple[str | None, ...]
    tile: tuple[int, ...]
    dtype: np.dtype
    kind: str
    first_tile: int
    id: int

    def __post_init__(self):
        # a step declares thousands of tensors of a few dozen layouts: each layout's arrays are made once
        extents, starts, self.grid, self._n_tiles, self._elements = _layout(tuple(self.shape), tuple(self.tile))
        self.extents, self.starts = list(extents), list(starts)

    @property
    def n_tiles(self) -> int:
        return self._n_tiles

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def tile_ids(self, *coords) -> np.ndarray:
        """Global tile ids for (broadcast) per-axis tile coordinates."""
        if len(coords) != len(self.grid):
            raise ValueError(f"{self.name}: {len(coords)} tile coordinates for {len(self.grid)} axes")
        ids, stride = self.first_tile, 1  # row-major arithmetic (np.ravel_multi_index's result, without its copies)
        for c, n in zip(reversed(coords), reversed(self.grid)):
            if isinstance(c, (int, np.integer)):  # e.g. the 0 of an untiled trailing axis: no array work
                if not 0 <= c < n:
                    raise ValueError(f"{self.name}: tile coordinate out of its grid {self.grid}")
                ids = ids + int(c) * stride
            else:
                c = np.asarray(c, dtype=np.int64)
                if c.size and (c.min() < 0 or c.max() >= n):
                    raise ValueError(f"{self.name}: tile coordinate out of its grid {self.grid}")
                ids = ids + (c * stride if stride != 1 else c)
            stride *= n
        return np.asarray(ids, dtype=np.int64) if np.ndim(ids) else np.int64(ids)

    def extent(self, axis: int, coord) -> np.ndarray:
        """Tile size along ``axis`` of the tiles at coordinate(s) ``coord``."""
        return self.extents[axis][coord]

    def start(self, axis: int, coord) -> np.ndarray:
        return self.starts[axis][coord]

    def tile_slices(self, index: int) -> tuple[slice, ...]:
        """The region of the full tensor held by local tile ``index``."""
        coords = np.unravel_index(index, self.grid)
        return tuple(
            slice(int(s[c]), int(s[c] + e[c])) for s, e, c in zip(self.starts, self.extents, coords)
        )

    def tile_shapes(self) -> np.ndarray:
        """(n_tiles, ndim) array of tile shapes, row-major over the grid."""
        mesh = np.meshgrid(*self.extents, indexing="ij")
        return np.stack([m.ravel() for m in mesh], axis=1) if mesh else np.zeros((1, 0), np.int64)

    def tile_elements(self) -> np.ndarray:
        """Elements of every tile, row-major over the grid (the product of :meth:`tile_shapes`' columns)."""
        return self._elements.copy()

    def split(self, full: np.ndarray) -> list[np.ndarray]:
        """Cut a full array into flat, contiguous tile buffers."""
        if tuple(full.shape) != self.shape:
            raise ValueError(f"{self.name}: expected shape {self.shape}, got {tuple(full.shape)}")
        return [
            np.ascontiguousarray(full[self.tile_slices(i)], dtype=self.dtype).ravel()
            for i in range(self.n_tiles)
        ]

    def join(self, tiles: list[np.ndarray]) -> np.ndarray:
        """Assemble flat tile buffers into the full array."""
        full = np.empty(self.shape, dtype=self.dtype)
        for i in range(self.n_tiles):
            sl = self.tile_slices(i)
            full[sl] = tiles[i].reshape([s.stop - s.start for s in sl])
        return full
