"""The tiling labels of tune's and demo's tables: short, and read back by --tile as the same tiling."""

import pytest

from tilecast.graph import Tiling
from tilecast.loop.candidates import short_label


@pytest.mark.parametrize("text, label", [
    ("64", "64"),
    ("512,head=2", "512,head=2"),  # the demo's head split: one size and the exception
    ("batch=512,seq=512,embd=64,head=64,inner=64,vocab=64", "64,batch=512,seq=512"),
    ("batch=8,seq=8,embd=32,head=1,inner=16,vocab=16", "batch=8,seq=8,embd=32,head=1,inner=16,vocab=16"),
    ("embd=64,inner=64", "embd=64,inner=64"),  # dimensions left whole stay unnamed
])
def test_short_label_reads_back_as_the_same_tiling(text, label):
    tiling = Tiling.parse(text)
    assert short_label(tiling) == label
    assert Tiling.parse(label).sizes == tiling.sizes
