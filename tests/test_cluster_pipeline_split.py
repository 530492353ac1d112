"""Uneven pipeline stages: the LM-head-aware split, explicit splits, their memory and timeline."""

import pytest

from tilecast.cluster import params as P
from tilecast.cluster.evaluate import evaluate
from tilecast.cluster.hardware import load_cluster
from tilecast.cluster.memory import stage_params
from tilecast.cluster.pipeline_split import balanced_split, stage_layers
from tilecast.cluster.strategy import Strategy, StrategyError
from tilecast.graph.model_config import load_model


def test_llama3_405b_head_aware_split_is_the_papers():
    # Dubey et al. 2024, Sec. 3.3.2: one layer fewer on the first and the last of 16 stages.
    st = Strategy(tp=8, pp=16, dp=1, seq=8192, global_batch=16, pipeline_split="head")
    assert stage_layers(load_model("llama3-405b"), st) == (7,) + (8,) * 14 + (7,)


def test_balanced_split_minimises_the_largest_stage():
    assert balanced_split(70, 12, 1.42) == (6,) * 11 + (4,)
    assert balanced_split(8, 4, 0.0) == (2, 2, 2, 2)
    assert balanced_split(9, 4, 0.0) == (2, 2, 2, 3)  # the first stages give up the spare layers


def test_bloom_70_layers_on_12_stages_runs_and_is_checked():
    shape, a100 = load_model("bloom-176b"), load_cluster("dgx-a100")
    even = Strategy(tp=4, pp=12, dp=8, global_batch=512, recompute="full")
    with pytest.raises(StrategyError, match="^pp/virtual_stages: 70 layers"):
        even.check(shape, a100)
    explicit = even.with_(stage_layers=(5,) + (6,) * 10 + (5,))
    r = evaluate(shape, explicit, a100)
    tags = r.timeline.tag
    per_stage = [sum(1 for i, t in enumerate(tags) if t.startswith("F") and r.timeline.stage[i] == s)
                 for s in (0, 1)]
    assert per_stage[0] == per_stage[1]  # one compute task per micro-batch, whatever the layer count
    # BLOOM's 250880 x 14336 embedding outweighs a layer: the last stage (5 layers, the head's copy of the
    # tied embedding, the final norm) is the heaviest, not a 6-layer one
    last = 5 * P.layer_params(shape) + shape.vocab_size * shape.n_embd + 2 * shape.n_embd
    assert last > 6 * P.layer_params(shape)
    assert stage_params(shape, explicit) == pytest.approx(last / 4)
    head = evaluate(shape, even.with_(pipeline_split="head"), a100)
    assert head.step_s < r.step_s * 1.05
    for bad, msg in [((6,) * 12, "sum to 72"), ((35, 35), "expected pp = 12"),
                     ((0,) + (7,) * 10 + (0,), "expected pp = 12")]:
        with pytest.raises(StrategyError, match="^stage_layers: .*" + msg):
            even.with_(stage_layers=bad).check(shape, a100)
    with pytest.raises(StrategyError, match="^stage_layers/pipeline_split"):
        Strategy(pp=2, dp=1, global_batch=4, schedule="interleaved", virtual_stages=5,
                 pipeline_split="head").check(shape)


def test_uneven_stages_change_the_step_as_their_layers_do():
    shape, h100 = load_model("llama2-7b"), load_cluster("dgx-h100")
    base = Strategy(pp=4, dp=2, seq=4096, global_batch=32, micro_batch=1)
    even = evaluate(shape, base, h100).step_s
    skewed = evaluate(shape, base.with_(stage_layers=(5, 9, 9, 9)), h100).step_s
    assert skewed > even * 1.05  # the 9-layer stages set the pace, 9/8 of the even ones
