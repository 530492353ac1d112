"""The mixture-of-experts layer's router, permutations, fp8 casts and token-count exchange (cluster/moe_costs.py)."""

from dataclasses import replace

import pytest

from tilecast.cluster import flops as F
from tilecast.cluster.collectives import Group, collective_time
from tilecast.cluster.costs import expert_all_to_all, layer_costs
from tilecast.cluster.hardware import load_cluster
from tilecast.cluster.moe_costs import moe_gemm_times, moe_layer_extra, moe_layer_parts
from tilecast.cluster.strategy import Strategy
from tilecast.graph.model_config import load_model

H100 = load_cluster("dgx-h100")
QWEN = load_model("qwen3-30b-a3b")  # hidden 2048, 128 experts of 768, top-8
TOKENS = 8192
BF16 = Strategy(dp=8, ep=8, seq=4096, global_batch=16, micro_batch=2)
FP8 = BF16.with_(dtype="fp8")


def _hbm(nbytes):
    return nbytes / (H100.gpu.memory_bandwidth * H100.gpu.memory_efficiency)


def test_dense_models_have_no_moe_parts():
    llama = load_model("llama3-8b")
    st = Strategy(dp=8, seq=4096, global_batch=16, dtype="fp8")
    assert moe_layer_parts(llama, st, H100, TOKENS, 2) == {}
    assert moe_layer_extra(llama, st, H100, TOKENS, 2) == (0.0, 0.0, 0.0)


def test_parts_by_hand():
    p = moe_layer_parts(QWEN, FP8, H100, TOKENS, 2)
    routed = TOKENS * 8
    # router: 4 fp32 passes over 8192 x 128 logits, 12 bytes per top-k choice
    assert p["router"][0] == pytest.approx(_hbm(TOKENS * (128 * 16 + 8 * 12)))
    # gather into expert order and scatter back: 4 x routed x hidden x 2 bytes, the backward as many
    assert p["permute"] == pytest.approx((_hbm(4 * routed * 2048 * 2),) * 2)
    assert p["sort_chunks"] == p["permute"]  # 16 local experts: regrouped after the all-to-all and back
    # fp8: 6 bytes per element of the fc1 input (2048) and fc2 input (768) forward; of the gradients of
    # fc2's output (2048) and of the gated fc1's (2 x 768) backward
    assert p["fp8_casts"][0] == pytest.approx(_hbm(routed * (2048 + 768) * 6))
    assert p["fp8_casts"][1] == pytest.approx(_hbm(routed * (2048 + 2 * 768) * 6))
    f = H100.intra_node  # 128 int64 counts among 8 ranks of a node: latency-bound
    assert p["token_counts"] == (pytest.approx(7 * f.latency + 7 / 8 * 128 * 8 / f.effective_bandwidth), 0.0)
    fwd, bwd, comm = moe_layer_extra(QWEN, FP8, H100, TOKENS, 2)
    assert fwd == pytest.approx(sum(v[0] for k, v in p.items() if k != "token_counts"))
    assert bwd == pytest.approx(sum(v[1] for k, v in p.items() if k != "token_counts"))
    assert comm == p["token_counts"][0]


def test_precision_and_layout_decide_which_parts_exist():
    assert "fp8_casts" not in moe_layer_parts(QWEN, BF16, H100, TOKENS, 2)
    one = BF16.with_(ep=1)
    assert "sort_chunks" not in moe_layer_parts(QWEN, one, H100, TOKENS, 2)
    assert "token_counts" not in moe_layer_parts(QWEN, one, H100, TOKENS, 2)
    few = replace(QWEN, n_experts=8, n_experts_per_token=2)  # one expert per rank: nothing to regroup
    assert "sort_chunks" not in moe_layer_parts(few, BF16, H100, TOKENS, 2)


@pytest.mark.parametrize("topk", [1, 2, 4, 8])
def test_parts_grow_with_top_k(topk):
    lo = moe_layer_parts(replace(QWEN, n_experts_per_token=topk), FP8, H100, TOKENS, 2)
    hi = moe_layer_parts(replace(QWEN, n_experts_per_token=2 * topk), FP8, H100, TOKENS, 2)
    for name in ("router", "permute", "sort_chunks", "fp8_casts"):
        assert hi[name][0] > lo[name][0] and hi[name][1] > lo[name][1], name
    assert hi["permute"][0] == pytest.approx(2 * lo["permute"][0])  # linear in the routed rows
    a = layer_costs(replace(QWEN, n_experts_per_token=topk), FP8, H100)
    b = layer_costs(replace(QWEN, n_experts_per_token=2 * topk), FP8, H100)
    assert b.fwd_compute > a.fwd_compute and b.bwd_compute > a.bwd_compute and b.fwd_ep > a.fwd_ep


def test_more_experts_cost_no_less():
    # at fixed top-k and EP, more experts: fewer rows per expert GEMM (lower efficiency) and a wider router
    prev = None
    for n in (16, 32, 64, 128, 256, 1024):
        model = replace(QWEN, n_experts=n)
        times = moe_gemm_times(F.moe_gemm_shapes(model, TOKENS, 1, 8, 1.0), H100.gpu, "fp8")
        cur = (times["expert_fc1"], times["expert_fc2"], moe_layer_parts(model, FP8, H100, TOKENS, 2)["router"][0])
        if prev is not None:
            assert all(c > p for c, p in zip(cur, prev)), n
        prev = cur
    # the same routed rows in fewer, larger calls (8 experts of 8192 rows, not 16 of 4096 per rank) run faster
    dense = replace(QWEN, n_experts=8, n_experts_per_token=8)
    one = moe_gemm_times(F.moe_gemm_shapes(dense, TOKENS, 1, 1, 1.0), H100.gpu, "fp8")["expert_fc1"]
    assert times["expert_fc1"] > one


def test_dispatch_volume_by_hand():
    # one dispatch carries 8192 tokens x top-8 x hidden 2048 x 2 bytes = 256 MiB; two per layer each way
    n = F.all_to_all_bytes(QWEN, TOKENS, 1, 2)
    assert n == 8192 * 8 * 2048 * 2 == 268_435_456
    one = collective_time("all_to_all", n, Group.placed(H100, 8, stride=1), H100)
    assert expert_all_to_all(QWEN, FP8, H100, TOKENS, 2) == (pytest.approx(2 * one), pytest.approx(2 * one))
    c = layer_costs(QWEN, FP8, H100)
    counts = moe_layer_parts(QWEN, FP8, H100, TOKENS, 2)["token_counts"][0]
    assert c.fwd_ep == pytest.approx(2 * one + counts) and c.bwd_ep == pytest.approx(2 * one)
