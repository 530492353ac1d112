"""The tiled Llama training step equals transformers' LlamaForCausalLM (tilecast verify --model llama-tiny)."""

import json

import pytest

from tilecast.graph import Tiling, TilingError
from tilecast.graph.model_config import load_model

pytest.importorskip("torch", reason="torch is the numeric reference; install tilecast[test]")
pytest.importorskip("transformers", reason="transformers is the numeric reference; install tilecast[test]")

from tilecast.reference.verify import TOLERANCES, verify  # noqa: E402

# 6 query heads in 3 groups of 2, head size 6, an inner size and a vocabulary that no tile divides.
ODD = ('{"family": "llama", "n_layer": 2, "n_embd": 36, "n_head": 6, "n_kv_head": 3, "intermediate_size": 50, '
       '"vocab_size": 101, "n_positions": 32}')
# Multi-head attention (one query head per key/value head), a tied head, one layer.
MHA_TIED = ('{"family": "llama", "n_layer": 1, "n_embd": 24, "n_head": 3, "n_kv_head": 3, '
            '"intermediate_size": 40, "vocab_size": 53, "n_positions": 16, "tie_word_embeddings": true}')

# (tiling, batch, seq) for llama-tiny (4 query heads, 2 key/value heads)
TILINGS = {
    "untiled": ("", 2, 12),
    "even": ("batch=1,seq=4,embd=16,head=2,inner=44,vocab=64", 2, 12),
    "uneven": ("batch=2,seq=5,embd=24,head=2,inner=48,vocab=60", 3, 12),
    "ones": ("seq=1,embd=7,head=2,inner=64,vocab=1", 1, 9),
}
ODD_TILINGS = {
    "untiled": "",
    "even": "batch=1,seq=13,embd=12,head=2,inner=25,vocab=101",
    "uneven": "batch=2,seq=4,embd=7,head=4,inner=17,vocab=17",
    "ones": "batch=1,seq=1,embd=5,head=2,inner=13,vocab=1",
}


def _check(res):
    assert res.loss <= TOLERANCES["loss"]
    assert res.logits <= TOLERANCES["logits"]
    assert max(res.grads.values()) <= TOLERANCES["grads"]
    assert max(res.params.values()) <= TOLERANCES["params"]
    assert res.ok


@pytest.mark.parametrize("tiling", list(TILINGS), ids=list(TILINGS))
def test_tiny_preset(tiling):
    spec, batch, seq = TILINGS[tiling]
    res = verify(load_model("llama-tiny"), batch, seq, Tiling.parse(spec))
    _check(res)
    # embedding, 9 per layer, final norm, untied head
    assert len(res.grads) == len(res.params) == 1 + 9 * 2 + 1 + 1
    assert "lm_head.weight" in res.grads


@pytest.mark.parametrize("tiling", list(ODD_TILINGS), ids=list(ODD_TILINGS))
def test_odd_shape(tiling):
    _check(verify(load_model(ODD), 3, 13, Tiling.parse(ODD_TILINGS[tiling])))


def test_multi_head_tied_size_one_heads():
    res = verify(load_model(MHA_TIED), 2, 7, Tiling.parse("seq=3,embd=5,head=1,inner=7,vocab=10"))
    _check(res)
    assert "lm_head.weight" not in res.grads


def test_head_tiles_that_split_a_group_are_refused(capsys):
    from tilecast.cli import main
    from tilecast.graph.llama import build_llama_step

    with pytest.raises(TilingError, match="head=3 splits the groups of 2 query heads.*multiple of 2"):
        build_llama_step(load_model(ODD), 1, 4, Tiling.parse("head=3"))
    rc = main(["verify", "--model", "llama-tiny", "--batch", "1", "--seq", "4", "--tile", "head=1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "multiple of 2" in err[0]


def test_a_wrong_kernel_is_caught():
    """The check can fail: a SwiGLU off by 1e-3 makes logits and gradients exceed their tolerances."""
    from tilecast.kernels import get

    k = get("swiglu")
    original = k.reference

    def bad(xp, bufs, p):
        original(xp, bufs, p)
        bufs[2] *= 1.001

    object.__setattr__(k, "reference", bad)  # Kernel is frozen; restored below
    try:
        res = verify(load_model("llama-tiny"), 2, 8, Tiling.parse("8"), params_dtype="float32")
    finally:
        object.__setattr__(k, "reference", original)
    assert not res.ok
    assert max(res.grads.values()) > TOLERANCES["grads"]


def test_cli_json(capsys):
    from tilecast.cli import main

    rc = main(["verify", "--model", "llama-tiny", "--batch", "1", "--seq", "8", "--tile", "4", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ok"] is True
    assert set(out) >= {"ok", "loss", "logits", "grads", "params"}
    assert "model.layers.1.self_attn.k_proj.weight" in out["params"]


def test_a_model_too_large_for_the_reference_is_refused_in_one_line(capsys):
    """llama3-70b's two float32/float64 copies in numpy and in transformers would exhaust memory: one line."""
    from tilecast.cli import main

    assert main(["verify", "--model", "llama3-70b", "--batch", "1", "--seq", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--model: llama3-70b is too large for a numpy reference check" in err[0], err
