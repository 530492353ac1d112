"""The tiled training step equals transformers' GPT2LMHeadModel (tilecast verify)."""

import json

import pytest

from tilecast.graph import Tiling
from tilecast.graph.model_config import load_model

pytest.importorskip("torch", reason="torch is the numeric reference; install tilecast[test]")
pytest.importorskip("transformers", reason="transformers is the numeric reference; install tilecast[test]")

from tilecast.reference.verify import TOLERANCES, verify  # noqa: E402

# Odd head count, prime sequence length, vocabulary a multiple of no tile size used.
ODD = '{"n_layer": 2, "n_embd": 30, "n_head": 3, "vocab_size": 101, "n_positions": 32}'

TILINGS = {
    "untiled": "",
    "even": "batch=1,seq=4,embd=16,head=2,inner=32,vocab=64",
    "uneven": "batch=2,seq=5,embd=24,head=3,inner=48,vocab=60",
    "ones": "seq=1,embd=7,head=1,vocab=1",
}
ODD_TILINGS = {
    "untiled": "",
    "even": "batch=1,seq=13,embd=10,head=1,inner=40,vocab=101",
    "uneven": "batch=2,seq=4,embd=7,head=2,inner=50,vocab=17",
    "ones": "batch=1,seq=1,embd=1,head=1",
}


def _check(res):
    assert res.loss <= TOLERANCES["loss"]
    assert max(res.grads.values()) <= TOLERANCES["grads"]
    assert max(res.params.values()) <= TOLERANCES["params"]
    assert res.ok


@pytest.mark.parametrize("tiling", list(TILINGS), ids=list(TILINGS))
def test_tiny_preset(tiling):
    res = verify(load_model("gpt2-tiny"), 2, 16, Tiling.parse(TILINGS[tiling]))
    _check(res)
    assert len(res.grads) == len(res.params) == 2 + 12 * 2 + 2


@pytest.mark.parametrize("tiling", list(ODD_TILINGS), ids=list(ODD_TILINGS))
def test_odd_shape(tiling):
    _check(verify(load_model(ODD), 3, 13, Tiling.parse(ODD_TILINGS[tiling])))


def test_a_wrong_kernel_is_caught():
    """The check can fail: a GELU off by 1e-3 makes gradients exceed their tolerance."""
    from tilecast.kernels import get

    k = get("gelu")
    original = k.reference

    def bad(xp, bufs, p):
        original(xp, bufs, p)
        bufs[1] *= 1.001

    object.__setattr__(k, "reference", bad)  # Kernel is frozen; restored below
    try:
        res = verify(load_model("gpt2-tiny"), 2, 8, Tiling.parse("8"))
    finally:
        object.__setattr__(k, "reference", original)
    assert not res.ok
    assert max(res.grads.values()) > TOLERANCES["grads"]


def test_cli_json(capsys):
    from tilecast.cli import main

    rc = main(["verify", "--model", "gpt2-tiny", "--batch", "1", "--seq", "8", "--tile", "4", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ok"] is True
    assert set(out) >= {"ok", "loss", "grads", "params"}
    assert "transformer.h.1.attn.c_attn.weight" in out["params"]
