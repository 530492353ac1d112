"""TileStore: a batch written into the store is copied, never aliased."""

import numpy as np

from tilecast.reference.tiles import TileStore
from tilecast.graph import GraphBuilder, Tiling


def test_write_tensor_copies_contiguous_tiles():
    b = GraphBuilder(Tiling.parse("batch=1"))
    b.tensor("ids", (2, 16), ("batch", "seq"), "input", np.int64)  # each tile is one contiguous row
    store = TileStore(b.build())
    data = np.arange(2 * 17, dtype=np.int64).reshape(2, 17)
    first = data[:, :-1]
    store.write_tensor("ids", first)
    want = first.copy()
    store.write_tensor("ids", np.zeros((2, 16), np.int64))  # the next batch
    assert np.array_equal(first, want)  # the caller's array is untouched
    assert not store.tensor("ids").any()
