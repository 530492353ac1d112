"""calibrate's timing of StarPU's search for a tile to reuse (tilecast/loop/walk_probe.py), on the real StarPU."""

import pytest

from tilecast.loop import walk_probe
from tilecast.loop.walk_probe import _session_writes, measure_walk_tile_s


def test_searches_walk_every_tile_held_with_tidying_off(tmp_path):
    """With tidying off every tile stays dirty, so each search walks past all the tiles held: a pair of writes past
    the limit takes longer with 32,768 tiles held than with 64 (by some 2 ms at 60 ns a tile, against about 0.4 ms
    for the pair itself; measured here 0.23-0.68 ms with 64 tiles and 0.85-4.2 ms with 32,768). The disk writes
    behind each eviction only add time, in spells that can slow every session of one side (a failure seen: 64 tiles'
    median 2.23 ms), so each side is its quickest of five sessions, taken in turn."""
    few, many = [], []
    for _ in range(5):
        few.append(_session_writes(str(tmp_path), 64, 60))
        many.append(_session_writes(str(tmp_path), 32768, 60))
    assert min(many) > min(few) + 0.3e-3, (few, many)


def test_measurement_and_its_source(tmp_path, monkeypatch):
    """The figure is the median run's (b - a) / (held difference), never negative, and its source says how."""
    seen = iter([1e-3, 2e-3, 1e-3, 1.5e-3, 1e-3, 9e-4])  # per tile: 1e-3/1000, 5e-4/1000, -1e-4/1000 (clipped)
    monkeypatch.setattr(walk_probe, "_session_writes", lambda d, h, w: next(seen))
    w = measure_walk_tile_s(str(tmp_path), held=(100, 1100), repeats=3)
    assert w.walk_tile_s == pytest.approx(5e-7) and w.write_s == (1e-3, 1.5e-3)
    assert "100 and 1100 tiles" in w.source and "tidying off" in w.source
    seen = iter([2e-3, 1e-3])
    assert measure_walk_tile_s(str(tmp_path), held=(100, 1100), repeats=1).walk_tile_s == 0.0
