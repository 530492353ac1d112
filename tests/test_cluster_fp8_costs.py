"""The casts an fp8 layer runs around its dense products (cluster/fp8_costs.py), outside the shared GEMM plateau."""

import pytest

import tilecast.cluster.costs as costs
from tilecast.cluster.fp8_costs import dense_fp8_cast_elements, dense_fp8_cast_times
from tilecast.cluster.hardware import load_cluster
from tilecast.cluster.moe_costs import FP8_CAST_BYTES
from tilecast.cluster.strategy import Strategy
from tilecast.graph.model_config import load_model

H100 = load_cluster("dgx-h100")
LLAMA = load_model("llama2-7b")  # hidden 4096, 32 heads of 128 (q = kv = 4096), SwiGLU 11008
FP8 = Strategy(dp=8, seq=4096, global_batch=16, micro_batch=1, dtype="fp8")


def _hbm(nbytes):
    return nbytes / (H100.gpu.memory_bandwidth * H100.gpu.memory_efficiency)


def test_the_four_products_inputs_forward_and_their_output_gradients_backward():
    m, h, f = 4096, 4096, 11008
    fwd, bwd = dense_fp8_cast_elements(LLAMA, m, 1)
    assert fwd == m * (h + h + h + f)  # QKV, proj, fc1, fc2 inputs
    assert bwd == m * ((h + 2 * h) + h + 2 * f + h)  # gradients of QKV's, proj's, gated fc1's, fc2's outputs
    fwd2, bwd2 = dense_fp8_cast_elements(LLAMA, m, 2)  # tensor parallelism splits the sharded widths only
    assert fwd2 == m * (h + h / 2 + h + f / 2) and bwd2 == m * (3 * h / 2 + h + f + h)
    t = dense_fp8_cast_times(LLAMA, FP8, H100.gpu, m)
    assert t == pytest.approx((_hbm(fwd * FP8_CAST_BYTES), _hbm(bwd * FP8_CAST_BYTES)))
    assert FP8_CAST_BYTES == 6  # amax read 2, value read 2, fp8 row-wise 1 and column-wise 1


def test_no_casts_in_bf16_and_a_moe_layers_experts_are_left_to_moe_costs():
    assert dense_fp8_cast_times(LLAMA, FP8.with_(dtype="bf16"), H100.gpu, 4096) == (0.0, 0.0)
    qwen = load_model("qwen3-30b-a3b")  # every layer MoE: the attention's casts only
    h, q, kv = qwen.n_embd, qwen.q_dim, qwen.kv_dim
    assert dense_fp8_cast_elements(qwen, 100, 1) == (100 * (h + q), 100 * (q + 2 * kv + h))


def test_layer_costs_carry_the_casts(monkeypatch):
    with_casts = costs.layer_costs(LLAMA, FP8, H100)
    monkeypatch.setattr(costs, "dense_fp8_cast_times", lambda *a: (0.0, 0.0))
    without = costs.layer_costs(LLAMA, FP8, H100)
    fwd, bwd = dense_fp8_cast_times(LLAMA, FP8, H100.gpu, 4096)
    assert with_casts.fwd_compute - without.fwd_compute == pytest.approx(fwd)
    assert with_casts.bwd_compute - without.bwd_compute == pytest.approx(bwd)
    assert fwd > 0.05 * without.fwd_compute  # not negligible: a few tenths of a millisecond a layer


def test_fp8_and_bf16_share_one_plateau_of_their_own_peaks():
    eff = H100.gpu.matmul_efficiency
    assert eff["fp8"].fraction == eff["bf16"].fraction
    assert H100.gpu.peak_flops["fp8"] == pytest.approx(2 * H100.gpu.peak_flops["bf16"], rel=1e-3)
