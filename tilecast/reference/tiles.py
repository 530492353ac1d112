"""Tile buffers for executing a graph: one flat, contiguous numpy array per tile.

Executors (the sequential numpy reference and StarPU) share this store, so a
graph's inputs are split and its results gathered the same way for both.
"""

from __future__ import annotations

import numpy as np

from tilecast.graph import Graph

TILE_ALIGN = 64  # bytes: a cache line, and the width of an AVX-512 vector


def aligned_empty(n: int, dtype, align: int = TILE_ALIGN) -> np.ndarray:
    """An uninitialised flat array of ``n`` elements whose data starts at a multiple of ``align`` bytes.

    numpy's allocator aligns to 16 bytes only; the C kernels' vector loops
    and BLAS panels run faster on tiles that start on a cache line (no
    vector load split across two lines). The array is a view of a slightly
    larger byte buffer, which it keeps alive.
    """
    dtype = np.dtype(dtype)
    raw = np.empty(n * dtype.itemsize + align, dtype=np.uint8)
    off = (-raw.__array_interface__["data"][0]) % align
    return raw[off:off + n * dtype.itemsize].view(dtype)


class TileStore:
    """``buffers[tile_id]`` is a flat array of the tile's dtype and size, or None if not allocated.

    Every buffer the store allocates starts on a 64-byte boundary
    (:func:`aligned_empty`); StarPU registers them in place.
    """

    def __init__(self, graph: Graph):
        self.graph = graph
        self.buffers: list[np.ndarray | None] = [None] * graph.n_tiles

    def set_tensor(self, name: str, full: np.ndarray) -> None:
        """Copy a full array into new tiles of tensor ``name``.

        A tile is never a view of ``full``: tiles set from one array (a batch of
        zeros for both ``ids`` and ``targets``) would otherwise share memory, and
        writing one tensor in place would change the other. Each tile is a new
        64-byte-aligned buffer.
        """
        t = self.graph.tensor(name)
        full = np.asarray(full)
        if tuple(full.shape) != t.shape:
            raise ValueError(f"{name}: expected shape {t.shape}, got {tuple(full.shape)}")
        for i in range(t.n_tiles):
            part = full[t.tile_slices(i)]
            buf = aligned_empty(part.size, t.dtype)
            np.copyto(buf.reshape(part.shape), part, casting="unsafe")  # the dtype conversion split() makes
            self.buffers[t.first_tile + i] = buf

    def write_tensor(self, name: str, full: np.ndarray) -> None:
        """Copy a full array into tensor ``name``'s existing tile buffers (allocating them if needed).

        Unlike :meth:`set_tensor`, the buffers stay the same objects, so an
        executor that keeps them registered (StarPU handles) need not register
        them again: what a training loop does with each new batch.
        """
        t = self.graph.tensor(name)
        full = np.asarray(full)
        if tuple(full.shape) != t.shape:
            raise ValueError(f"{name}: expected shape {t.shape}, got {tuple(full.shape)}")
        tiles = self.buffers[t.first_tile:t.first_tile + t.n_tiles]
        if any(b is None for b in tiles):
            # split() returns views where a tile is a contiguous run of ``full``: copy, or the caller's
            # array would become the tile (and the next batch written here would overwrite it)
            self.set_tensor(name, np.array(full, dtype=t.dtype, copy=True))
            return
        for i, buf in enumerate(tiles):
            sl = t.tile_slices(i)
            np.copyto(buf.reshape([s.stop - s.start for s in sl]), full[sl], casting="same_kind")

    def tensor(self, name: str) -> np.ndarray:
        """Gather tensor ``name`` from its tiles (all must be allocated)."""
        t = self.graph.tensor(name)
        tiles = self.buffers[t.first_tile:t.first_tile + t.n_tiles]
        if any(b is None for b in tiles):
            raise ValueError(f"tensor {name!r} has tiles that were never written")
        return t.join(tiles)

    def allocate_all(self) -> None:
        """Allocate (uninitialised) every tile not allocated yet, e.g. before a StarPU run."""
        for t in self.graph.tensors:
            for i, shape in enumerate(t.tile_shapes()):
                tid = t.first_tile + i
                if self.buffers[tid] is None:
                    self.buffers[tid] = aligned_empty(int(np.prod(shape)), t.dtype)

    def tensors(self, names) -> dict[str, np.ndarray]:
        return {n: self.tensor(n) for n in names}
