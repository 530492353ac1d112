"""Step timeline on the stream engine: textbook pipeline bubbles, overlap, monotonicity, speed."""

import time

import pytest

from tilecast.cluster.costs import LayerCosts
from tilecast.cluster.evaluate import evaluate
from tilecast.cluster.hardware import load_cluster
from tilecast.cluster.strategy import Strategy
from tilecast.cluster.timeline import breakdown, build_timeline
from tilecast.graph.model_config import ModelConfig, load_model

FREE = LayerCosts(fwd_compute=1.0, bwd_compute=2.0, recompute=0.0, fwd_tp=0.0, bwd_tp=0.0, head_fwd=0.0,
                  head_bwd=0.0, p2p=0.0, layer_param_gather=0.0, layer_grad_scatter=0.0, grad_reduce=0.0,
                  grad_scatter=0.0, param_gather=0.0, optimizer=0.0, grad_bytes=1.0, flops_fwd_layer=1.0)
SHAPE = ModelConfig(name="toy", n_layer=16, n_embd=64, n_head=4, vocab_size=100, n_positions=2048)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("p, m", [(2, 1), (4, 8), (8, 8), (4, 32)])
def test_pipeline_bubble_is_textbook_with_free_communication(schedule, p, m):
    st = Strategy(pp=p, global_batch=m, schedule=schedule)
    tl = build_timeline(SHAPE, st, FREE).simulate()
    bd = breakdown(tl)
    per_stage = SHAPE.n_layer // p * (1.0 + 2.0)
    assert bd["step_s"] == pytest.approx((m + p - 1) * per_stage)
    assert bd["bubble_s"] / bd["step_s"] == pytest.approx((p - 1) / (m + p - 1))
    assert bd["exposed_comm_s"] == pytest.approx(0.0)


@pytest.mark.parametrize("p, v, m", [(4, 2, 8), (4, 4, 16), (2, 2, 4)])
def test_interleaving_divides_the_bubble(p, v, m):
    st = Strategy(pp=p, global_batch=m, schedule="interleaved", virtual_stages=v)
    bd = breakdown(build_timeline(SHAPE, st, FREE).simulate())
    per_stage = SHAPE.n_layer // p * 3.0
    # Narayanan et al. 2021: bubble time (p - 1) / v stage-passes
    assert bd["step_s"] == pytest.approx(m * per_stage + (p - 1) * per_stage / v)


def test_gradient_buckets_overlap_backward():
    c = load_cluster("dgx-a100")
    shape = load_model("gpt2-xl")
    st = Strategy(dp=64, seq=1024, global_batch=64 * 4, micro_batch=4)
    on = evaluate(shape, st, c)
    off = evaluate(shape, st.with_(overlap_grad_reduce=False), c)
    assert on.step_s < off.step_s
    assert on.breakdown["overlapped_comm_s"] > 0.5 * off.breakdown["exposed_comm_s"]
    assert off.breakdown["overlapped_comm_s"] == pytest.approx(0.0, abs=1e-9)


def test_breakdown_adds_up():
    c = load_cluster("dgx-h100")
    r = evaluate(load_model("gpt3-175b"), Strategy(tp=8, pp=8, dp=4, seq=2048, global_batch=256,
                                                   recompute="selective", sequence_parallel=True), c)
    b = r.breakdown
    assert b["compute_s"] + b["exposed_comm_s"] + b["bubble_s"] + b["optimizer_s"] == pytest.approx(r.step_s)
    assert b["bubble_s"] > 0 and b["tp_comm_s"] > 0
    assert 0 < r.mfu < 1


CONFIGS = [
    ("gpt3-175b", Strategy(tp=8, pp=8, dp=4, seq=2048, global_batch=128, recompute="full")),
    ("gpt2-xl", Strategy(dp=32, seq=1024, global_batch=128, micro_batch=4, zero=3)),
    ("mpt-13b", Strategy(tp=2, pp=2, dp=8, seq=2048, global_batch=64, schedule="interleaved",
                         virtual_stages=2, zero=1)),
    ("mpt-7b", Strategy(dp=16, seq=2048, global_batch=64, zero=2, overlap_grad_reduce=False)),
]


@pytest.mark.parametrize("name, st", CONFIGS)
def test_more_bandwidth_never_slows_a_step(name, st):
    c = load_cluster("dgx-a100")
    shape = load_model(name)
    steps = [evaluate(shape, st, c.scaled(network_bandwidth=x, nvlink_bandwidth=y)).step_s
             for x, y in [(0.5, 0.5), (1, 1), (2, 1), (2, 2), (4, 4)]]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(steps, steps[1:])), steps


def test_3072_gpu_configuration_under_a_second():
    c = load_cluster("dgx-a100")
    st = Strategy(tp=8, pp=16, dp=24, seq=2048, global_batch=1536, recompute="selective",
                  sequence_parallel=True, schedule="interleaved", virtual_stages=2)
    t0 = time.process_time()
    r = evaluate(load_model("gpt3-175b"), st, c)
    elapsed = time.process_time() - t0
    print(f"one 3072-GPU configuration: {elapsed:.3f} s of CPU")
    assert r.gpus == 3072
    assert elapsed < 1.0, f"{elapsed:.2f} s of CPU for one 3072-GPU configuration"


def test_search_space_speed_1000_configs_per_minute():
    from tilecast.cluster.search import candidates

    c = load_cluster("dgx-a100")
    shape = load_model("gpt3-175b")
    cands = candidates(shape, c, 3072, 2048, 1536)[:200]
    assert len(cands) == 200
    t0 = time.process_time()
    for st in cands:
        evaluate(shape, st, c)
    elapsed = time.process_time() - t0
    print(f"200 configurations: {elapsed:.2f} s of CPU")
    assert elapsed < 12.0, f"{elapsed:.1f} s of CPU for 200 configurations (budget: 1000 per minute)"
