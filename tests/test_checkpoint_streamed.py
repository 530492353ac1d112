"""Checkpoints written and read one array at a time (what train does under --memory-limit): the same file as
save_checkpoint writes, at most about one array in memory, and damage still found before anything is loaded."""

import tracemalloc

import numpy as np
import pytest

from tilecast.data.checkpoint import (CheckpointError, checkpoint_arrays, load_checkpoint, save_checkpoint,
                                          verify_checkpoint, write_checkpoint)

SHAPES = {"a": (512, 1024), "b": (1024, 512), "c": (256, 2048)}  # 2 MiB of float32 each
GROUPS = ("params", "adam_m", "adam_v")
META = dict(step=3, sampler_state={"draws": 3}, rng_state={}, model={"n_layer": 1}, tiling={"tile": 32})


def value(group, name):
    """A distinct array per (group, name), made without temporaries (one array's memory)."""
    a = np.arange(int(np.prod(SHAPES[name])), dtype=np.float32).reshape(SHAPES[name])
    a += GROUPS.index(group) * 10 + sorted(SHAPES).index(name)
    return a


def test_streamed_file_is_the_saved_file_and_holds_one_array_at_a_time(tmp_path):
    saved = save_checkpoint(str(tmp_path / "saved.npz"), **{g: {n: value(g, n) for n in SHAPES} for g in GROUPS},
                            **META)
    tracemalloc.start()
    streamed = write_checkpoint(str(tmp_path / "streamed.npz"), SHAPES, value, **META)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    one = 2 << 20
    # one array at a time (made by value(), its bytes written, dropped): all nine would be 18 MiB
    assert peak < 3 * one, peak
    a, b = load_checkpoint(saved), load_checkpoint(streamed)
    assert a.step == b.step == 3
    for g in GROUPS:
        for n in SHAPES:
            np.testing.assert_array_equal(getattr(a, g)[n], getattr(b, g)[n])
    c = verify_checkpoint(streamed, model=META["model"], tiling=META["tiling"])
    assert c.step == 3 and c.params == {} and c.sampler_state == {"draws": 3}
    got = [(g, n) for g, n, _ in checkpoint_arrays(streamed)]
    assert got == [(g, n) for g in GROUPS for n in sorted(SHAPES)]


def test_streamed_checks_find_damage_and_wrong_shapes(tmp_path):
    path = write_checkpoint(str(tmp_path / "c.npz"), SHAPES, value, **META)
    raw = bytearray(open(path, "rb").read())
    raw[len(raw) // 2] ^= 0xFF  # inside an array's payload
    bad = tmp_path / "bad.npz"
    bad.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="corrupted"):
        verify_checkpoint(str(bad))
    with pytest.raises(CheckpointError, match="model shape differs"):
        verify_checkpoint(path, model={"n_layer": 2})
    with pytest.raises(ValueError, match=r"adam_m\['a'\] has shape"):
        write_checkpoint(str(tmp_path / "d.npz"), SHAPES,
                         lambda g, n: value(g, n)[:1] if (g, n) == ("adam_m", "a") else value(g, n), **META)
    assert not (tmp_path / "d.npz").exists()  # nothing written: the file is replaced only when complete
