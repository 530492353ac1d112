"""Transformer shapes: GPT-2 presets agree with model_config, larger shapes match their papers."""

import json

import pytest

from tilecast.cluster.flops import model_flops_per_token
from tilecast.cluster.models import load_shape
from tilecast.graph.model_config import ModelConfigError, load_model


@pytest.mark.parametrize("name", ["gpt2", "gpt2-medium", "gpt2-xl"])
def test_gpt2_presets_count_the_same_parameters(name):
    assert load_shape(name).n_params() == load_model(name).n_params()


@pytest.mark.parametrize("name, billions", [("gpt3-175b", 175), ("mt-nlg-530b", 530), ("bloom-176b", 176.2),
                                            ("llama2-70b", 69), ("llama3-405b", 405), ("mpt-30b", 30)])
def test_published_sizes(name, billions):
    assert load_shape(name).n_params() / 1e9 == pytest.approx(billions, rel=0.02)


def test_json_shapes_both_schemas(tmp_path):
    gpt2_style = load_shape(json.dumps(dict(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32)))
    assert gpt2_style.d_model == 64 and gpt2_style.learned_positions == 32
    f = tmp_path / "m.json"
    f.write_text(json.dumps(dict(n_layer=4, d_model=256, n_head=8, n_kv_head=2, d_ff=704, vocab=1000,
                                 gated_mlp=True)))
    s = load_shape(str(f))
    assert s.kv_dim == 64 and s.ff == 704
    with pytest.raises(ModelConfigError, match="n_kv_head"):
        load_shape(json.dumps(dict(n_layer=1, d_model=64, n_head=4, n_kv_head=3, vocab=10)))
    with pytest.raises(ModelConfigError, match="colour"):
        load_shape(json.dumps(dict(n_layer=1, d_model=64, n_head=4, vocab=10, colour=1)))


def test_model_flops_per_token_is_6n_plus_attention():
    s = load_shape("gpt3-175b")  # tied embedding: counted once, as the head; the position table is a lookup
    n = s.n_params() - 2048 * 12288
    assert model_flops_per_token(s, 2048) == pytest.approx(6 * n + 12 * 96 * 12288 * 2048)
