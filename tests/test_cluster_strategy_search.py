"""Layout validation, sweeps and the layout search."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from tilecast.cluster.evaluate import evaluate
from tilecast.cluster.hardware import load_cluster
from tilecast.cluster.memory import memory_per_gpu
from tilecast.cluster.search import candidates, search
from tilecast.cluster.strategy import Strategy, StrategyError
from tilecast.cluster.sweep import parse_values, sweep
from tilecast.graph.model_config import load_model

C = load_cluster("dgx-a100")
GPT3 = load_model("gpt3-175b")


@pytest.mark.parametrize("kw, field", [
    (dict(tp=3), "tp:"),
    (dict(pp=5), "pp/virtual_stages:"),
    (dict(dp=3), "global_batch:"),
    (dict(schedule="interleaved", pp=1), "schedule: interleaved"),
    (dict(schedule="1f1b", virtual_stages=2, pp=2), "virtual_stages:"),
    (dict(zero=4), "zero:"),
    (dict(recompute="some"), "recompute:"),
    (dict(sequence_parallel=True), "sequence_parallel:"),
    (dict(dtype="int4"), "dtype:"),
    (dict(tp=8, pp=8, dp=128), "gpus:"),
])
def test_bad_layouts_name_the_field(kw, field):
    st = Strategy(seq=2048, global_batch=1024, **kw)
    with pytest.raises(StrategyError) as e:
        st.check(GPT3, C)
    assert str(e.value).startswith(field)


def test_sweep_values_parse():
    assert parse_values("network_bw", "x0.5..x4") == [0.5, 1.0, 2.0, 4.0]
    assert parse_values("flops", "1,2") == [1.0, 2.0]
    assert parse_values("tp", "2,4,8") == [2, 4, 8]
    assert parse_values("schedule", "1f1b,interleaved") == ["1f1b", "interleaved"]


def test_sweep_flops_and_tp_with_fixed_gpus():
    st = Strategy(tp=8, pp=8, dp=4, seq=2048, global_batch=256, recompute="selective", sequence_parallel=True)
    rows = sweep(GPT3, st, C, "flops", [1.0, 2.0])
    t1, t2 = (r["result"].step_s for r in rows)
    assert t2 < t1 < 2 * t2  # twice the FLOP/s: faster, but communication does not shrink
    rows = sweep(GPT3, st, C, "tp", [2, 4, 8, 3], gpus=256)
    assert [r["result"].strategy["dp"] for r in rows[:3]] == [16, 8, 4]
    assert "error" in rows[3]  # 3 x 8 does not divide 256 GPUs


def test_search_respects_memory_and_ranks_by_throughput():
    res = search(GPT3, C, 512, 2048, 512, top=5, max_configs=60, progress=False)
    assert res["fitting"] < res["candidates"]  # some layouts do not fit in 80 GB
    top = res["top"]
    assert top and all(r.fits for r in top)
    assert [r.tokens_per_s for r in top] == sorted((r.tokens_per_s for r in top), reverse=True)
    for st in candidates(GPT3, C, 512, 2048, 512)[:50]:
        assert st.gpus == 512 and GPT3.n_layer % (st.pp * st.virtual_stages) == 0


LAYOUTS = hs.fixed_dictionaries({
    "tp": hs.sampled_from([1, 2, 4, 8]),
    "pp": hs.sampled_from([1, 2, 4]),
    "dp": hs.sampled_from([1, 2, 8, 16]),
    "mb": hs.sampled_from([1, 2]),
    "zero": hs.sampled_from([0, 1, 2, 3]),
    "rec": hs.sampled_from(["none", "selective", "full"]),
    "overlap": hs.booleans(),
    "factor": hs.sampled_from([1.5, 2.0, 8.0]),
    "schedule": hs.sampled_from(["1f1b", "gpipe", "interleaved"]),
})


@settings(max_examples=30, deadline=None)
@given(LAYOUTS)
def test_property_more_bandwidth_never_slower(x):
    shape = load_model("mpt-13b")
    interleaved = x["schedule"] == "interleaved" and x["pp"] > 1
    st = Strategy(tp=x["tp"], pp=x["pp"], dp=x["dp"], seq=2048, global_batch=x["dp"] * x["mb"] * 4,
                  micro_batch=x["mb"], zero=x["zero"], recompute=x["rec"], overlap_grad_reduce=x["overlap"],
                  sequence_parallel=x["tp"] > 1, schedule="interleaved" if interleaved else
                  ("1f1b" if x["schedule"] == "interleaved" else x["schedule"]), virtual_stages=2 if interleaved else 1)
    base = evaluate(shape, st, C)
    fast = evaluate(shape, st, C.scaled(network_bandwidth=x["factor"], nvlink_bandwidth=x["factor"]))
    assert fast.step_s <= base.step_s * (1 + 1e-12)
    assert base.memory_per_gpu_bytes == pytest.approx(memory_per_gpu(shape, st, C).total)
