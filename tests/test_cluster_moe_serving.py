"""Serving a mixture of experts: each expert's GEMM is its own call (a grouped GEMM), sized by its rows."""

import pytest

from tilecast.cluster.hardware import load_cluster
from tilecast.cluster.inference_costs import InferenceEfficiency, gemm_time, layer_pass, moe_kernels
from tilecast.cluster.inference_validation import load_inference_runs
from tilecast.graph.model_config import load_model

A100 = load_cluster("dgx-a100")
MIXTRAL = load_model("mixtral-8x7b")


def test_routed_experts_run_one_call_per_expert_and_matrix():
    k = moe_kernels(MIXTRAL, tokens=4096, tp=2, ep=1, wb=2, load=1.0)
    (fl_in, _, calls_in), (fl_out, _, calls_out) = k[0], k[1]
    assert calls_in == calls_out == pytest.approx(8.0)  # 4096 tokens touch all 8 experts
    h, fe = MIXTRAL.n_embd, MIXTRAL.expert_intermediate_size
    assert fl_in == pytest.approx(2 * 4096 * 2 * h * 2 * fe / 2)  # tokens x top-2 rows, gate and up, 1/tp
    assert fl_out == pytest.approx(2 * 4096 * 2 * fe * h / 2)
    # with EP 2 of the 2 GPUs a GPU runs half the experts, each whole: half the calls, the same flops
    k2 = moe_kernels(MIXTRAL, tokens=4096, tp=2, ep=2, wb=2, load=1.0)
    assert k2[0][2] == pytest.approx(4.0) and k2[0][0] == pytest.approx(fl_in)


def test_small_per_expert_gemms_cost_more_than_one_call_of_their_flops():
    # a prefill of 2 sequences x 128 tokens: 64 rows per expert; the eight calls sit lower on the GEMM curve
    eff = InferenceEfficiency()
    fl, _, calls = moe_kernels(MIXTRAL, tokens=256, tp=2, ep=1, wb=2, load=1.0)[0]
    per_expert = calls * float(gemm_time(A100.gpu, fl / calls, "fp16", eff))
    assert per_expert > 1.2 * float(gemm_time(A100.gpu, fl, "fp16", eff))
    c = layer_pass(MIXTRAL, A100, tp=2, seqs=2, new_tokens=128, context=0, weight_dtype="fp16", kv_dtype="fp16",
                   eff=eff)
    # each kernel takes the longer of its compute and its weight reads: the layer takes at least the calls
    assert float(c.compute_s + c.memory_s) >= per_expert


def test_v09_mixtral_rows_are_predicted_at_16_bits():
    # TensorRT-LLM could not quantize Mixtral to FP8 before v0.10.0: its v0.9.0 "FP8" Mixtral rows run 16-bit
    rows = [r for r in load_inference_runs() if "mixtral" in r.id]
    assert len(rows) == 12
    for r in rows:
        assert r.config.weight_dtype == "fp16" and r.config.kv_dtype == "fp16"
        if r.cluster != "dgx-a100":
            assert {"weight_dtype", "kv_dtype"} <= set(r.assumed)
