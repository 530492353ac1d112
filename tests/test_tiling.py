import pytest

from tilecast.graph import DIMS, Tiling, TilingError
from tilecast.graph.tiling import tile_extents


def test_blanket_size_sets_every_dimension():
    t = Tiling.parse("256")
    assert t.sizes == {d: 256 for d in DIMS}


def test_named_sizes_leave_others_untiled():
    t = Tiling.parse("seq=128,embd=256,head=2")
    assert t.sizes == {"seq": 128, "embd": 256, "head": 2}
    assert t.tile("vocab", 50257) == 50257


def test_blanket_and_named_combine_named_wins():
    t = Tiling.parse("256,head=4")
    assert t.sizes["head"] == 4 and t.sizes["embd"] == 256


def test_size_larger_than_dimension_means_untiled():
    assert Tiling.parse("512").tile("seq", 100) == 100


def test_uneven_last_tile():
    assert tile_extents(10, 4).tolist() == [4, 4, 2]
    assert tile_extents(7, 1).tolist() == [1] * 7
    assert tile_extents(8, 8).tolist() == [8]


@pytest.mark.parametrize("spec, word", [("0", "below 1"), ("embd=-3", "embd"), ("foo=3", "foo"),
                                         ("seq=abc", "seq")])
def test_bad_tilings_name_the_problem(spec, word):
    with pytest.raises(TilingError, match=word):
        Tiling.parse(spec)
