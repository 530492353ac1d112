"""Heads wider (or narrower) than hidden / heads: Qwen3-30B-A3B and GPT-OSS-120B in the cluster what-if."""

import json

import pytest

from tilecast.cli import main
from tilecast.cluster import flops as F
from tilecast.cluster import params as P
from tilecast.cluster.calibrate import NEVER_FITTED, fittable
from tilecast.cluster.inference_memory import kv_bytes_per_token
from tilecast.cluster.validation import load_runs
from tilecast.graph.model_config import ModelConfig, ModelConfigError, load_model

# Qwen/Qwen3-30B-A3B/config.json, the fields tilecast reads
QWEN3_30B_A3B = {"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
                 "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
                 "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
                 "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000.0,
                 "rms_norm_eps": 1e-06, "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False}
# openai/gpt-oss-120b/config.json, the fields tilecast reads
GPT_OSS_120B = {"model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 36, "num_attention_heads": 64,
                "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "num_local_experts": 128,
                "num_experts_per_tok": 4, "experts_per_token": 4, "vocab_size": 201088,
                "max_position_embeddings": 131072, "rope_theta": 150000, "rms_norm_eps": 1e-05,
                "rope_scaling": {"rope_type": "yarn", "factor": 32.0}, "tie_word_embeddings": False,
                "hidden_act": "silu", "attention_bias": True}
DENSE = dict(family="llama", n_layer=2, n_embd=64, n_head=4, n_kv_head=2, intermediate_size=128, vocab_size=64,
             n_positions=32)


@pytest.mark.parametrize("data, preset", [(QWEN3_30B_A3B, "qwen3-30b-a3b"), (GPT_OSS_120B, "gpt-oss-120b")])
def test_config_json_head_dim_is_read_and_matches_the_preset(tmp_path, data, preset):
    f = tmp_path / "config.json"
    f.write_text(json.dumps(data))
    cfg = load_model(str(f))
    assert cfg.head_dim == data["head_dim"] and cfg.q_dim == data["num_attention_heads"] * data["head_dim"]
    assert cfg.q_dim != cfg.n_embd and not cfg.default_head_dim
    assert cfg.shape() == load_model(preset).shape() and cfg.shape()["head_dim"] == data["head_dim"]


def test_published_sizes_need_the_head_dim():
    qwen = load_model("qwen3-30b-a3b")
    # Qwen3 model card: 30.5 B parameters, 3.3 B activated
    for total, active in ((qwen.n_params(), qwen.n_params(active=True)), (P.n_params(qwen), P.n_active_params(qwen))):
        assert total / 1e9 == pytest.approx(30.5, rel=0.02) and active / 1e9 == pytest.approx(3.3, rel=0.03)
    # with heads of hidden / heads (64) the attention would be half as wide: 48 x (2048 x (2048 + 2 x 256) +
    # 2048 x 2048) = 0.45 B parameters fewer
    narrow = ModelConfig(**{**qwen.to_dict(), "head_dim": None})
    assert narrow.head_dim == 64 and qwen.n_params() - narrow.n_params() == 48 * (2048 * 2560 + 2048 * 2048)
    oss = load_model("gpt-oss-120b")
    # gpt-oss model card: 116.8 B parameters, 5.1 B active (without the input embedding, a lookup)
    assert P.n_params(oss) / 1e9 == pytest.approx(116.8, rel=0.01)
    assert F.model_params(oss) / 1e9 == pytest.approx(5.13, rel=0.02)


def test_head_dim_sets_attention_flops_projections_and_kv_cache():
    base = load_model(json.dumps(DENSE))
    wide = load_model(json.dumps({**DENSE, "head_dim": 32}))  # queries 128 wide, hidden 64
    assert base.head_dim == 16 and wide.q_dim == 128 and wide.kv_dim == 64
    shapes = F.layer_gemm_shapes(wide, tokens=10, tp=2)
    assert shapes["qkv"] == (10, (128 + 2 * 64) / 2, 64) and shapes["proj"] == (10, 64, 128 / 2)
    assert F.layer_attention_flops(wide, 10, 32, 1) == 8 * F.layer_attention_flops(base, 10, 32, 4)
    # 6N + 12 L q s: the parameters and the attention term both follow the query width
    dn = F.model_params(wide) - F.model_params(base)
    # per layer: QKV weights 64 x (256 - 128) and biases 256 - 128, output projection (128 - 64) x 64
    assert dn == 2 * (64 * 128 + 128 + 64 * 64)
    d_flops = F.model_flops_per_token(wide, 32) - F.model_flops_per_token(base, 32)
    assert d_flops == pytest.approx(6 * dn + 12 * 2 * (128 - 64) * 32)
    assert kv_bytes_per_token(wide, 1, 1, "bf16") == 2 * kv_bytes_per_token(base, 1, 1, "bf16")
    qwen = load_model("qwen3-30b-a3b")
    assert kv_bytes_per_token(qwen, 1, 1, "bf16") == 2 * 4 * 128 * 2 * 48


def test_default_head_dim_changes_nothing():
    plain = load_model(json.dumps(DENSE))
    stated = load_model(json.dumps({**DENSE, "head_dim": 16}))
    assert stated == plain and "head_dim" not in plain.to_dict() and "head_dim" not in plain.shape()
    with pytest.raises(ModelConfigError, match="head_dim"):
        load_model(json.dumps({**DENSE, "head_dim": 0}))
    with pytest.raises(ModelConfigError, match="n_embd"):  # without head_dim, heads must divide n_embd
        load_model(json.dumps({**DENSE, "n_head": 3, "n_kv_head": 1}))


def test_tile_graphs_refuse_another_head_dim_in_one_line(capsys):
    odd = load_model(json.dumps({**DENSE, "head_dim": 32}))
    with pytest.raises(ModelConfigError, match="head_dim 32"):
        odd.check_tiled()
    assert load_model(json.dumps(DENSE)).check_tiled()
    assert main(["graph", "--model", json.dumps({**DENSE, "head_dim": 32}), "--batch", "1", "--seq", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--model" in err[0] and "head_dim 32" in err[0] and "whatif" in err[0]


def test_megatron_bridge_moe_rows_are_held_out_and_never_fitted():
    runs = {r.id: r for r in load_runs()}
    qwen, oss = runs["mbridge-qwen3-30b-a3b-16"], runs["mbridge-gpt-oss-120b-64"]
    assert qwen.published == 5275 * 16 and oss.published == 5630 * 64
    assert {qwen.role, oss.role} == {"validation"} and "mbridge" in NEVER_FITTED
    assert qwen.strategy.ep == 8 and qwen.strategy.pp == 2 and qwen.strategy.virtual_stages == 24
    assert qwen.strategy.dtype == "fp8" and oss.strategy.dtype == "bf16" and oss.strategy.pp == 4
    assert oss.strategy.micro_batch == 1 and "micro_batch" in oss.assumed  # the recipe's, not the table's 4
    assert not any(r.source == "mbridge" for r in fittable(runs.values()))
