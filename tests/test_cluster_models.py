"""Model shapes in the cluster: one description (ModelConfig) with the cluster's parameter counts."""

import json

import pytest

from tilecast.cluster import params as P
from tilecast.cluster.flops import model_flops_per_token
from tilecast.graph.model_config import ModelConfigError, load_model


@pytest.mark.parametrize("name", ["gpt2", "gpt2-medium", "gpt2-xl", "gpt3-175b"])
def test_gpt2_family_counts_the_same_parameters(name):
    assert P.n_params(load_model(name)) == load_model(name).n_params()


@pytest.mark.parametrize("name, billions", [("gpt3-175b", 175), ("mt-nlg-530b", 530), ("bloom-176b", 176.2),
                                            ("llama2-70b", 69), ("llama3-405b", 405), ("mpt-30b", 30)])
def test_published_sizes(name, billions):
    assert P.n_params(load_model(name)) / 1e9 == pytest.approx(billions, rel=0.02)
    assert load_model(name).n_params() / 1e9 == pytest.approx(billions, rel=0.02)


def test_json_shapes_and_the_decoder_family(tmp_path):
    gpt2_style = load_model(json.dumps(dict(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32)))
    assert gpt2_style.n_embd == 64 and gpt2_style.learned_positions == 32
    f = tmp_path / "m.json"
    f.write_text(json.dumps(dict(family="decoder", position_embedding="alibi", activation="swiglu", n_layer=4,
                                 n_embd=256, n_head=8, n_kv_head=2, intermediate_size=704, vocab_size=1000,
                                 n_positions=64)))
    s = load_model(str(f))
    assert s.kv_dim == 64 and s.intermediate_size == 704 and s.gated_mlp and s.learned_positions == 0
    with pytest.raises(ModelConfigError, match="n_kv_head"):
        load_model(json.dumps(dict(n_layer=1, n_embd=64, n_head=4, n_kv_head=3, vocab_size=10, n_positions=8)))
    with pytest.raises(ModelConfigError, match="colour"):
        load_model(json.dumps(dict(n_layer=1, n_embd=64, n_head=4, vocab_size=10, n_positions=8, colour=1)))
    with pytest.raises(ModelConfigError, match="position_embedding"):
        load_model(json.dumps(dict(family="decoder", position_embedding="sinusoid", n_layer=1, n_embd=64,
                                   n_head=4, vocab_size=10, n_positions=8)))


@pytest.mark.parametrize("name", ["mpt-7b", "bloom-176b", "mixtral-8x7b"])
def test_tile_graphs_refuse_what_they_do_not_build_in_one_line(name):
    from tilecast.graph.models import build_step

    with pytest.raises(ModelConfigError, match=f"model: {name} is a .*tilecast whatif") as e:
        build_step(load_model(name), 1, 8)
    assert "\n" not in str(e.value)


def test_model_flops_per_token_is_6n_plus_attention():
    s = load_model("gpt3-175b")  # tied embedding: counted once, as the head; the position table is a lookup
    n = s.n_params() - 2048 * 12288
    assert model_flops_per_token(s, 2048) == pytest.approx(6 * n + 12 * 96 * 12288 * 2048)
