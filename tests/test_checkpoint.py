"""Checkpoints: exact round trip, atomic replacement, and one-line errors for every bad file."""

import json
import os
import zipfile

import numpy as np
import pytest

from tilecast.data import checkpoint as ckpt
from tilecast.data.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from tilecast.data.corpus import BatchSampler
from tilecast.graph.model_config import load_model
from tilecast.graph.tiling import Tiling

MODEL = load_model("gpt2-tiny")
TILING = Tiling.parse("32,head=2")


def state(seed=0):
    r = np.random.default_rng(seed)
    params = {"wte": r.standard_normal((256, 64), dtype=np.float32),
              "h.0.ln_1.b": r.standard_normal(64, dtype=np.float32),
              "h.0.attn.w": r.standard_normal((64, 192), dtype=np.float32).T,  # not C-contiguous
              "scale": np.float64(np.nan) * np.ones(()),                          # 0-d, NaN
              "empty": np.zeros((0, 3), np.float32)}
    m = {k: np.asarray(v) * 0.5 for k, v in params.items()}
    v = {k: np.asarray(v) ** 2 for k, v in params.items()}
    sampler = BatchSampler(np.arange(1000, dtype=np.uint8) % 251, 2, 8, seed=5)
    sampler.next()
    gen = np.random.default_rng(42)
    gen.random(3)
    return dict(params=params, adam_m=m, adam_v=v, step=17, sampler_state=sampler.state(),
                rng_state=gen.bit_generator.state, model=MODEL, tiling=TILING, extra={"losses": [5.5, 4.25]})


@pytest.fixture
def saved(tmp_path):
    s = state()
    return save_checkpoint(str(tmp_path / "ckpt.npz"), **s), s


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.ascontiguousarray(a).tobytes() == \
        np.ascontiguousarray(b).tobytes()


def test_round_trip_is_exact(saved):
    path, s = saved
    c = load_checkpoint(path, model=MODEL, tiling=TILING)
    for group in ("params", "adam_m", "adam_v"):
        assert c.__dict__[group].keys() == s[group].keys()
        for name in s[group]:
            assert same(c.__dict__[group][name], s[group][name]), (group, name)
    assert c.step == 17 and c.extra == {"losses": [5.5, 4.25]}
    assert c.model == MODEL.shape() and c.tiling == TILING.sizes
    assert c.sampler_state == json.loads(json.dumps(s["sampler_state"]))
    # the restored generators continue exactly where the saved ones were
    gen = np.random.default_rng(0)
    gen.bit_generator.state = c.rng_state
    ref = np.random.default_rng(42)
    ref.random(3)
    assert np.array_equal(gen.random(5), ref.random(5))


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="no such file"):
        load_checkpoint(str(tmp_path / "none.npz"))


@pytest.mark.parametrize("keep", [0.5, 0.99, 100])
def test_truncated_file(saved, keep):
    path, _ = saved
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(int(size * keep) if keep < 1 else keep)
    with pytest.raises(CheckpointError, match="corrupted") as e:
        load_checkpoint(path)
    assert "\n" not in str(e.value)


def test_bit_flips_are_caught_or_harmless(saved):
    """A flipped bit either raises CheckpointError or (in zip metadata nothing reads) changes no value."""
    path, s = saved
    original = open(path, "rb").read()
    raised = 0
    for pos in np.linspace(0, len(original) - 1, 60).astype(int):
        damaged = bytearray(original)
        damaged[pos] ^= 0x10
        with open(path, "wb") as f:
            f.write(damaged)
        try:
            c = load_checkpoint(path)
        except CheckpointError as e:
            raised += 1
            assert "\n" not in str(e)
            continue
        for name in s["params"]:
            assert same(c.params[name], s["params"][name])
        assert c.step == s["step"]
    assert raised > 45  # nearly every byte of the file is array data or checked structure


def test_payload_checksum_catches_a_consistent_rewrite(saved, tmp_path):
    """An archive whose zip CRCs are right but whose arrays changed is refused by the payload checksum."""
    path, _ = saved
    with np.load(path) as z:
        members = {k: z[k] for k in z.files}
    key = max((k for k in members if k != "manifest"), key=lambda k: members[k].size)
    members[key] = members[key].copy()
    members[key].flat[0] += 1
    np.savez(path, **members)
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load_checkpoint(path)


def test_mismatched_model_shape(saved):
    path, _ = saved
    with pytest.raises(CheckpointError, match="model shape differs: n_embd=64 in the checkpoint, 128 requested"):
        load_checkpoint(path, model=dict(MODEL.shape(), n_embd=128))
    with pytest.raises(CheckpointError, match="tiling differs"):
        load_checkpoint(path, tiling=Tiling.parse("16"))


def test_not_a_checkpoint(tmp_path):
    other = str(tmp_path / "other.npz")
    np.savez(other, x=np.zeros(3))
    with pytest.raises(CheckpointError, match="no manifest"):
        load_checkpoint(other)
    text = tmp_path / "notes.npz"
    text.write_text("hello")
    with pytest.raises(CheckpointError, match="corrupted or not a checkpoint"):
        load_checkpoint(str(text))


def test_interrupted_save_keeps_the_previous_checkpoint(saved, monkeypatch):
    path, s = saved
    before = open(path, "rb").read()

    written = []
    write_array = ckpt.np.lib.format.write_array

    def interrupted(f, a, **kw):  # the first array written, then Ctrl-C in the middle of the second
        if written:
            f.write(b"\x93NUMPY partial")
            raise KeyboardInterrupt
        written.append(a.shape)
        write_array(f, a, **kw)

    monkeypatch.setattr(ckpt.np.lib.format, "write_array", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, **dict(s, step=18))
    assert open(path, "rb").read() == before
    assert os.listdir(os.path.dirname(path)) == ["ckpt.npz"]  # no temporary file left behind
    assert zipfile.is_zipfile(path) and load_checkpoint(path).step == 17


def test_moments_must_match_parameters(tmp_path):
    s = state()
    s["adam_v"] = dict(s["adam_v"], wte=np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="adam_v\\['wte'\\] has shape"):
        save_checkpoint(str(tmp_path / "x.npz"), **s)
