import json

import pytest

from tilecast.graph.model_config import PRESETS, ModelConfig, ModelConfigError, load_model


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_load(name):
    cfg = load_model(name)
    assert cfg.n_embd % cfg.n_head == 0


def test_gpt2_parameter_count_matches_published_124m():
    # 124,439,808 parameters (tied LM head): the figure transformers reports for "gpt2".
    assert load_model("gpt2").n_params() == 124_439_808


def test_inline_json_and_file(tmp_path):
    shape = {"n_layer": 1, "n_embd": 6, "n_head": 3, "vocab_size": 7, "n_positions": 5}
    assert load_model(json.dumps(shape)).n_embd == 6
    f = tmp_path / "m.json"
    f.write_text(json.dumps(shape))
    assert load_model(str(f)).name == "m"


@pytest.mark.parametrize("shape, field", [
    ({"n_layer": 1, "n_embd": 10, "n_head": 3, "vocab_size": 7, "n_positions": 5}, "n_head"),
    ({"n_layer": 0, "n_embd": 6, "n_head": 3, "vocab_size": 7, "n_positions": 5}, "n_layer"),
    ({"n_layer": 1, "n_embd": 6, "n_head": 3, "vocab_size": -7, "n_positions": 5}, "vocab_size"),
    ({"n_layer": 1, "n_embd": 6, "n_head": 3, "vocab_size": 7}, "n_positions"),
])
def test_bad_shapes_name_the_field(shape, field):
    with pytest.raises(ModelConfigError, match=field):
        load_model(json.dumps(shape))


# Parameter counts as transformers reports them for the published checkpoints.
@pytest.mark.parametrize("name, count", [
    ("smollm2-135m", 134_515_008), ("tinyllama-1.1b", 1_100_048_384), ("llama-3.2-1b", 1_235_814_400)])
def test_llama_parameter_counts(name, count):
    assert load_model(name).n_params() == count


def test_gpt2_descriptions_keep_their_meaning():
    cfg = load_model(json.dumps({"n_layer": 1, "n_embd": 6, "n_head": 3, "vocab_size": 7, "n_positions": 5,
                                 "name": "m", "layer_norm_epsilon": 1e-6}))
    assert (cfg.family, cfg.norm, cfg.n_kv_head, cfg.n_inner, cfg.tie_word_embeddings) == ("gpt2", "layernorm", 3,
                                                                                            24, True)
    assert cfg.shape() == {"n_layer": 1, "n_embd": 6, "n_head": 3, "vocab_size": 7, "n_positions": 5}


def test_llama_tiny_preset():
    cfg = load_model("llama-tiny")
    assert (cfg.family, cfg.norm, cfg.activation, cfg.position_embedding, cfg.bias) == (
        "llama", "rmsnorm", "swiglu", "rope", False)
    assert (cfg.n_kv_head, cfg.group_size, cfg.n_inner, cfg.tie_word_embeddings) == (2, 2, 176, False)
    assert load_model(json.dumps(cfg.shape())) == ModelConfig(name="custom", **cfg.shape())


def _llama_config_json(**over):
    # The fields of a transformers LlamaConfig.to_json_file(), as in SmolLM2-135M's config.json.
    d = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
         "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30,
         "vocab_size": 49152, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000,
         "hidden_act": "silu", "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
         "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 0}
    d.update(over)
    return d


def test_transformers_config_json(tmp_path):
    folder = tmp_path / "SmolLM2-135M"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_llama_config_json()))
    for spec in (folder / "config.json", folder):
        cfg = load_model(str(spec))
        assert cfg.name == "SmolLM2-135M"
        assert cfg.shape() == load_model("smollm2-135m").shape()
        assert cfg.rope_theta == 100000.0
    gpt2 = tmp_path / "config.json"
    gpt2.write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256,
                                "n_positions": 128, "n_inner": None, "activation_function": "gelu_new"}))
    assert load_model(str(gpt2)).shape() == load_model("gpt2-tiny").shape()


@pytest.mark.parametrize("over, field", [
    ({"attention_bias": True}, "attention_bias"), ({"hidden_act": "gelu"}, "hidden_act"),
    ({"num_key_value_heads": 2}, "n_kv_head"), ({"model_type": "mistral"}, "model_type")])
def test_transformers_config_json_refusals(tmp_path, over, field):
    f = tmp_path / "config.json"
    f.write_text(json.dumps(_llama_config_json(**over)))
    with pytest.raises(ModelConfigError, match=field):
        load_model(str(f))


@pytest.mark.parametrize("shape, field", [
    ({"family": "gpt2", "n_kv_head": 1}, "n_kv_head"), ({"family": "llama", "norm": "layernorm"}, "norm"),
    ({"family": "bert"}, "family"), ({"family": "llama", "n_embd": 12, "n_head": 4}, "even head size"),
    ({"family": "gpt2", "tie_word_embeddings": False}, "ties")])
def test_bad_family_fields(shape, field):
    base = {"n_layer": 1, "n_embd": 8, "n_head": 2, "vocab_size": 7, "n_positions": 5}
    with pytest.raises(ModelConfigError, match=field):
        load_model(json.dumps({**base, **shape}))
