"""In-order streams: the fixed policy's fused loop gives the engine's general loop's times bit for bit.

The cluster what-if simulates its layer-level timelines through it, so the layouts' figures are
compared too: every figure of a handful of layouts (interleaved, ZeRO-1/3, hybrid sharding, mixture of
experts with expert parallelism, context parallelism, fp8) is the same on both loops. Serving
(``whatif --inference``) builds no stream timeline and does not go through either loop.
"""

import numpy as np
import pytest

from tilecast.cluster.evaluate import evaluate
from tilecast.cluster.hardware import load_cluster
from tilecast.cluster.strategy import Strategy
from tilecast.graph.model_config import load_model
from tilecast.simulator import simulate_streams
from tilecast.simulator.engine import Engine
from tilecast.simulator.policies.fixed import FixedInOrder


@pytest.fixture
def loops(monkeypatch):
    """Run ``f()`` on the fused loop, then on the general loop: (fused result, general result)."""
    def both(f):
        fused = f()
        monkeypatch.setattr(Engine, "fused_loops", False)
        try:
            return fused, f()
        finally:
            monkeypatch.setattr(Engine, "fused_loops", True)
    return both


def random_streams(seed):
    """A random graph on a few streams: coarse durations (ties), zeros, fan-in, long and short chains."""
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(1, 400)), int(rng.integers(1, 7))
    preds = [sorted(set(rng.integers(0, i, size=int(rng.integers(0, min(i, 4) + 1))).tolist())) if i else []
             for i in range(n)]
    ptr = np.zeros(n + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(p) for p in preds])
    pred = np.array([x for p in preds for x in p], dtype=np.int64)
    scale = float(rng.choice([1e-5, 1.0, 1e3]))  # magnitudes where the clock's rounding shows
    d = rng.integers(0, 5, n) * scale * rng.choice([1.0, 0.1, 1 / 3])
    return d, rng.integers(0, k, n), ptr, pred, k


@pytest.mark.parametrize("seed", range(40))
def test_fused_loop_equals_the_general_loop(loops, seed):
    d, stream, ptr, pred, k = random_streams(seed)
    (s1, e1), (s2, e2) = loops(lambda: simulate_streams(d, stream, ptr, pred, k))
    np.testing.assert_array_equal(s1, s2)
    np.testing.assert_array_equal(e1, e2)


def test_fused_loop_is_used_only_without_other_costs():
    d, stream, ptr, pred, k = random_streams(1)
    plain = Engine(d[None, :], ptr, pred, [0] * k, [0] * k, FixedInOrder(stream))
    plain.policy.submit()
    assert plain.policy.fused_run()
    costly = Engine(d[None, :], ptr, pred, [0] * k, [0] * k, FixedInOrder(stream), overhead=1e-6)
    costly.policy.submit()
    assert not costly.policy.fused_run()  # the general loop charges the overhead
    d[len(d) // 2] = np.inf
    endless = Engine(d[None, :], ptr, pred, [0] * k, [0] * k, FixedInOrder(stream))
    endless.policy.submit()
    assert not endless.policy.fused_run()  # a task that never ends is the general loop's to meet


LAYOUTS = [
    ("gpt3-175b", "dgx-a100", Strategy(tp=8, pp=16, dp=24, seq=2048, global_batch=1536, recompute="selective",
                                       sequence_parallel=True, schedule="interleaved", virtual_stages=2)),
    ("gpt3-175b", "dgx-h100", Strategy(tp=8, pp=8, dp=4, seq=2048, global_batch=128, recompute="full",
                                       dtype="fp8", tp_comm_overlap=True)),
    ("gpt2-xl", "dgx-a100", Strategy(dp=32, seq=1024, global_batch=128, micro_batch=4, zero=3, shard_group=8)),
    ("mpt-13b", "dgx-a100", Strategy(tp=2, pp=2, dp=8, seq=2048, global_batch=64, schedule="interleaved",
                                     virtual_stages=2, zero=1, overlap_param_gather=True)),
    ("mpt-7b", "dgx-a100", Strategy(dp=16, seq=2048, global_batch=64, zero=2, overlap_grad_reduce=False)),
    ("mixtral-8x7b", "dgx-h100", Strategy(tp=2, pp=4, dp=8, ep=8, seq=4096, global_batch=256,
                                          expert_imbalance=1.2, recompute="selective")),
    ("llama2-7b", "dgx-h100", Strategy(tp=2, cp=4, dp=4, seq=32768, global_batch=16, sequence_parallel=True,
                                       recompute="full", pipeline_split="head")),
]


def _figures(r):
    d = r.to_dict()
    d["start"], d["end"] = r.timeline.start.tolist(), r.timeline.end.tolist()
    return d


@pytest.mark.parametrize("model, cluster, st", LAYOUTS, ids=[f"{m}-{c}" for m, c, _ in LAYOUTS])
def test_layout_figures_are_the_same_on_both_loops(loops, model, cluster, st):
    shape, c = load_model(model), load_cluster(cluster)
    fused, general = loops(lambda: _figures(evaluate(shape, st, c)))
    assert fused["step_s"] > 0 and fused["n_tasks"] > 0
    assert fused == general
