"""GraphBuilder.add: scalars broadcast over a batch; inconsistent batches are refused with one line."""

import numpy as np
import pytest

from tilecast.graph import GraphBuilder, Tiling
from tilecast.kernels import R, RW, W


def _builder():
    b = GraphBuilder(Tiling())
    t = b.tensor("t", (4,), ("embd",), "activation", tiles={"embd": 1})
    return b, t


def test_scalars_and_arrays_broadcast_over_the_batch():
    b, t = _builder()
    n = b.add("axpy", [t.first_tile + np.array([0, 1, 2]), t.first_tile + 3], dict(n=1, alpha=[0.5, 1.0, 2.0]),
              modes=[None, np.array([W, RW, RW])])
    g = b.build()
    assert n == 3 and g.n_tasks == 3
    assert g.acc_tile.tolist() == [0, 3, 1, 3, 2, 3]
    assert g.acc_mode.tolist() == [R, W, R, RW, R, RW]
    assert g.params.tolist() == [1, 0.5, 1, 1.0, 1, 2.0]


def test_inconsistent_batches_are_refused():
    b, t = _builder()
    with pytest.raises(ValueError, match="axpy: 2 modes expected, got 1"):
        b.add("axpy", [0, 1], dict(n=1, alpha=1.0), modes=[W])
    with pytest.raises(ValueError, match="different lengths"):
        b.add("axpy", [[0, 1], [1, 2, 3]], dict(n=1, alpha=1.0))


def test_tile_ids_are_row_major_and_refuse_coordinates_off_the_grid():
    b = GraphBuilder(Tiling({"batch": 1, "seq": 2, "embd": 3}))
    t = b.tensor("x", (2, 5, 7), ("batch", "seq", "embd"), "activation")
    rng = np.random.default_rng(1)
    c = [rng.integers(0, n, 50) for n in t.grid]
    expect = t.first_tile + np.ravel_multi_index(c, t.grid)
    assert t.tile_ids(*c).tolist() == expect.tolist()
    assert t.tile_ids(c[0], 1, c[2]).tolist() == (t.first_tile + np.ravel_multi_index((c[0], 1, c[2]), t.grid)).tolist()
    assert int(t.tile_ids(1, 2, 2)) == t.first_tile + np.ravel_multi_index((1, 2, 2), t.grid)
    with pytest.raises(ValueError, match="out of its grid"):
        t.tile_ids(0, 3, 0)
    with pytest.raises(ValueError, match="out of its grid"):
        t.tile_ids(0, np.array([0, -1]), 0)
