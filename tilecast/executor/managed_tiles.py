"""Tiles whose memory StarPU owns: registered with home node -1, so that StarPU may evict them.

A :class:`~tilecast.reference.tiles.TileStore` keeps each tile in a numpy
array registered in place: StarPU can never move such a tile out of main
memory, since its home is that array. A :class:`ManagedTileStore` registers
every tile with no home (StarPU allocates it on first use, as NNTile does); the
host writes and reads a tile only through ``starpu_data_acquire`` on main
memory (``tcs_tiles_write``/``tcs_tiles_read`` in the glue), one tile at a time,
so that under a memory limit with a disk node StarPU can evict any tile not in
use to disk and fetch it back when a task or the host needs it.

The store has the interface executors and the training loop use
(``set_tensor``, ``write_tensor``, ``tensor``, ``tensors``), but no ``buffers``:
there is no host array to look at in place. It lives as long as the StarPU
session that registered it; the session unregisters it (dropping the data)
before it shuts down.
"""

from __future__ import annotations

import numpy as np

from tilecast.executor.starpu_native import glue
from tilecast.reference.tiles import TileStore


class ManagedTileStore(TileStore):
    """Every tile of ``graph`` registered on ``session`` with home node -1 (StarPU-allocated)."""

    def __init__(self, graph, session):
        floats = {t.dtype for t in graph.tensors if t.dtype.kind == "f"}
        if floats - {np.dtype(np.float32)}:
            raise ValueError(f"the StarPU executor runs float32 graphs only (this one has "
                             f"{sorted(map(str, floats))})")
        session._require_open()
        self.graph = graph
        self.g = glue()
        n = graph.n_tiles
        self.n = n
        nbytes = np.asarray(graph.tile_nbytes, dtype=np.int64)
        itemsize = np.array([graph.tensors[t].dtype.itemsize for t in graph.tile_tensor], dtype=np.int64)
        self._itemsize = itemsize
        self._nbytes = nbytes
        self.handles = self.g.ffi.new("void *[]", max(n, 1))
        f = self.g.ffi.from_buffer
        nelem = np.ascontiguousarray(nbytes // np.maximum(itemsize, 1), dtype=np.int64)
        self.g.lib.tcs_register_managed(n, f("int64_t[]", nelem), f("int64_t[]", np.ascontiguousarray(itemsize)),
                                        self.handles)
        self.owned = np.ones(n, dtype=bool)  # False where a handle is another store's (share_tensor)
        self.written = np.zeros(n, dtype=bool)  # tiles given a value by the host (tasks write the others)
        self.session = session
        session.managed_stores.append(self)

    @property
    def buffers(self):
        raise AttributeError("a ManagedTileStore has no host buffers (StarPU owns its tiles); "
                             "use tensor()/set_tensor()")

    # --- host access, through starpu_data_acquire ---------------------------------------
    def _copy(self, tids: np.ndarray, arrays: list, write: bool) -> None:
        addrs = np.fromiter((a.__array_interface__["data"][0] for a in arrays), np.uint64, len(arrays))
        f = self.g.ffi.from_buffer
        idx = np.ascontiguousarray(tids, dtype=np.int64)
        fn = self.g.lib.tcs_tiles_write if write else self.g.lib.tcs_tiles_read
        err = fn(len(idx), f("int64_t[]", idx), f("uint64_t[]", addrs), self.handles)
        if err:
            raise RuntimeError(f"StarPU could not acquire a tile of {self.graph.tensors[self.graph.tile_tensor[idx[0]]].name!r}"
                               f" (error {err})")

    def set_tensor(self, name: str, full: np.ndarray) -> None:
        """Copy a full array into tensor ``name``'s tiles."""
        t = self.graph.tensor(name)
        full = np.asarray(full)
        if tuple(full.shape) != t.shape:
            raise ValueError(f"{name}: expected shape {t.shape}, got {tuple(full.shape)}")
        parts = [np.ascontiguousarray(p, dtype=t.dtype).reshape(-1) for p in t.split(full)]
        tids = np.arange(t.first_tile, t.first_tile + t.n_tiles)
        self._copy(tids, parts, write=True)
        self.written[tids] = True

    write_tensor = set_tensor

    def write_tiles(self, tids, arrays: list) -> None:
        """Copy each array of ``arrays`` (flat, the tile's size) into the tile of the same place in ``tids``, one
        ``starpu_data_acquire`` each, in that order (:mod:`tilecast.loop.walk_probe` times them one by one)."""
        tids = np.asarray(tids, dtype=np.int64)
        self._copy(tids, [np.ascontiguousarray(a) for a in arrays], write=True)
        self.written[tids] = True

    def tensor(self, name: str) -> np.ndarray:
        """Gather tensor ``name`` from its tiles (read through acquire; tiles on disk come back first)."""
        t = self.graph.tensor(name)
        tids = np.arange(t.first_tile, t.first_tile + t.n_tiles)
        parts = [np.empty(int(np.prod(s)), dtype=t.dtype) for s in t.tile_shapes()]
        self._copy(tids, parts, write=False)
        return t.join(parts)

    def allocate_all(self) -> None:
        """Nothing to do: StarPU allocates a tile when it is first written."""

    def share_tensor(self, name: str, other: "ManagedTileStore", other_name: str | None = None) -> None:
        """Point tensor ``name``'s tiles at ``other``'s tiles of ``other_name`` (same tiling): both stores
        then see one copy, e.g. a forward graph evaluating the step graph's parameters."""
        mine, theirs = self.graph.tensor(name), other.graph.tensor(other_name or name)
        if not np.array_equal(mine.tile_shapes(), theirs.tile_shapes()):
            raise ValueError(f"tensor {name!r} is tiled differently in the two graphs")
        for i in range(mine.n_tiles):
            a, b = mine.first_tile + i, theirs.first_tile + i
            if self.owned[a] and self.handles[a] != self.g.ffi.NULL:
                self.g.lib.tcs_unregister_managed(1, self.g.ffi.addressof(self.handles, a))
            self.handles[a] = other.handles[b]
            self.owned[a] = False

    def close(self) -> None:
        """Unregister the tiles this store owns (their data are dropped); safe to call twice."""
        if self.handles is None:
            return
        for tid in np.flatnonzero(~self.owned).tolist():
            self.handles[tid] = self.g.ffi.NULL
        self.g.lib.tcs_unregister_managed(self.n, self.handles)
        self.handles = None
        if self in self.session.managed_stores:
            self.session.managed_stores.remove(self)
