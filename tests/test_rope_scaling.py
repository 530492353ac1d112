"""RoPE scaling (transformers' rope_type "linear", "llama3", "dynamic") in the tile kernels, checked against
transformers' LlamaForCausalLM and run on StarPU."""

import json

import numpy as np
import pytest

from tilecast.graph import Tiling
from tilecast.graph.model_config import load_model
from tilecast.kernels.definitions.llama import rope_inv_freq

torch = pytest.importorskip("torch", reason="torch is the numeric reference; install tilecast[test]")
transformers = pytest.importorskip("transformers",
                                   reason="transformers is the numeric reference; install tilecast[test]")

from tilecast.reference.verify import TOLERANCES, verify  # noqa: E402

BASE = {"family": "llama", "n_layer": 2, "n_embd": 32, "n_head": 4, "n_kv_head": 2, "intermediate_size": 48,
        "vocab_size": 67, "n_positions": 64}
# Head size 8, theta 10000: wavelengths 2 pi x (1, 10, 100, 1000). A pretraining context of 16 positions with
# low/high frequency factors 0.25 and 2 keeps the first, interpolates the second, divides the other two by 8;
# the checks run 20 positions, beyond that context.
LLAMA3 = dict(rope_scaling="llama3", rope_factor=8.0, rope_low_freq_factor=0.25, rope_high_freq_factor=2.0,
              rope_original_positions=16)
LINEAR = dict(rope_scaling="linear", rope_factor=4.0)
TILINGS = ["", "batch=1,seq=7,embd=12,head=2,inner=20,vocab=30"]


def _hf_config_json(**rope):
    """A transformers config.json of BASE's shape with ``rope`` as its rope_scaling."""
    return {"model_type": "llama", "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 67, "max_position_embeddings": 64,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
            "rope_scaling": rope}


@pytest.mark.parametrize("d, theta, rope", [
    (64, 500000.0, dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                        original_max_position_embeddings=8192)),  # Llama-3.2-1B's
    (128, 500000.0, dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                         original_max_position_embeddings=8192)),  # Llama-3.1-8B's
    (8, 10000.0, dict(rope_type="llama3", factor=8.0, low_freq_factor=0.25, high_freq_factor=2.0,
                      original_max_position_embeddings=16)),
    (64, 10000.0, dict(rope_type="linear", factor=4.0))], ids=["llama3.2", "llama3.1", "tests", "linear"])
def test_frequencies_are_transformers_bit_for_bit(d, theta, rope):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    conf = transformers.LlamaConfig(hidden_size=2 * d, num_attention_heads=2, max_position_embeddings=131072,
                                    rope_parameters=dict(rope_theta=theta, **rope))
    want, attention_factor = ROPE_INIT_FUNCTIONS[rope["rope_type"]](conf)
    got = rope_inv_freq(d, theta, rope["factor"], rope.get("low_freq_factor", 0.0),
                        rope.get("high_freq_factor", 0.0), rope.get("original_max_position_embeddings", 0.0))
    assert attention_factor == 1.0  # no rescaling of cos and sin for these types
    np.testing.assert_array_equal(got, want.numpy())
    unscaled = rope_inv_freq(d, theta)
    changed = got != unscaled
    assert changed.any() and (changed.all() if rope["rope_type"] == "linear" else not changed.all())
    if rope["rope_type"] == "llama3":  # some frequencies interpolated, neither kept nor divided by the factor
        assert (~np.isclose(got, unscaled) & ~np.isclose(got, unscaled / rope["factor"])).any()


@pytest.mark.parametrize("tiling", TILINGS, ids=["untiled", "uneven"])
@pytest.mark.parametrize("scaling", [LLAMA3, LINEAR], ids=["llama3", "linear"])
def test_verify_against_transformers(scaling, tiling):
    res = verify(load_model(json.dumps({**BASE, **scaling})), 2, 20, Tiling.parse(tiling))
    assert res.loss <= TOLERANCES["loss"] and res.logits <= TOLERANCES["logits"]
    assert max(res.grads.values()) <= TOLERANCES["grads"] and max(res.params.values()) <= TOLERANCES["params"]
    assert res.ok


def test_the_check_sees_an_unscaled_rotation(monkeypatch):
    """The check can fail: tile graphs rotating at the unscaled frequencies miss transformers' logits."""
    from tilecast.graph import llama

    cfg = load_model(json.dumps({**BASE, **LLAMA3}))
    monkeypatch.setattr(llama, "rope_frequencies", lambda c: dict(theta=c.rope_theta, factor=1.0, low_freq=0.0,
                                                                  high_freq=0.0, orig_pos=0.0))
    res = verify(cfg, 2, 20, Tiling.parse(""), params_dtype="float32")
    assert not res.ok  # logits off by 1.0e-3, a gradient by 0.40
    assert res.logits > 5 * TOLERANCES["logits"] and max(res.grads.values()) > 100 * TOLERANCES["grads"]


def test_dynamic_scaling_is_the_unscaled_rotation_within_n_positions():
    # transformers' dynamic NTK scaling changes theta only for sequences beyond max_position_embeddings
    res = verify(load_model(json.dumps({**BASE, "rope_scaling": "dynamic", "rope_factor": 2.0})), 1, 20,
                 Tiling.parse(""), params_dtype="float32")
    assert res.ok


def test_config_json_with_llama3_scaling_runs_on_starpu(tmp_path, capsys):
    from tilecast.cli import main

    f = tmp_path / "config.json"
    f.write_text(json.dumps(_hf_config_json(rope_type="llama3", factor=8.0, low_freq_factor=0.25,
                                            high_freq_factor=2.0, original_max_position_embeddings=16)))
    cfg = load_model(str(f))
    assert {k: getattr(cfg, k) for k in LLAMA3} == LLAMA3 and cfg.numeric_error() is None
    rc = main(["run", "--model", str(f), "--batch", "2", "--seq", "20", "--tile", "seq=8,embd=16,head=2",
               "--workers", "1", "--steps", "2", "--check", "--json"])
    captured = capsys.readouterr()
    if rc == 2 and "StarPU" in captured.out + captured.err:
        pytest.skip("StarPU is not available here")
    res = json.loads(captured.out)
    assert rc == 0 and res["check"]["ok"], captured.err


def test_config_json_rope_parameters_form(tmp_path):
    # transformers 5 writes the scaling with theta under rope_parameters
    f = tmp_path / "config.json"
    d = _hf_config_json(rope_type="linear", factor=4.0)
    del d["rope_scaling"], d["rope_theta"]
    d["rope_parameters"] = dict(rope_type="linear", factor=4.0, rope_theta=500000.0)
    f.write_text(json.dumps(d))
    cfg = load_model(str(f))
    assert (cfg.rope_scaling, cfg.rope_factor, cfg.rope_theta) == ("linear", 4.0, 500000.0)
    assert cfg.rope_low_freq_factor is None and cfg.numeric_error() is None


def test_llama_3_2_1b_scales_as_its_config_json_says():
    cfg = load_model("llama-3.2-1b")
    assert cfg.numeric_error() is None
    assert (cfg.rope_scaling, cfg.rope_factor, cfg.rope_original_positions) == ("llama3", 32.0, 8192)


@pytest.mark.parametrize("rope, message", [
    (dict(rope_type="yarn", factor=4.0), "rope_type 'yarn'"),
    (dict(rope_type="llama3", factor=8.0), "needs rope_low_freq_factor")])
def test_what_the_kernels_do_not_apply_is_refused_in_one_line(tmp_path, capsys, rope, message):
    from tilecast.cli import main

    f = tmp_path / "config.json"
    f.write_text(json.dumps(_hf_config_json(**rope)))
    assert main(["run", "--model", str(f), "--batch", "1", "--seq", "8", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
