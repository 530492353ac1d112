"""Expert parallelism as a dimension of ``whatif --search`` and ``--sweep``."""

import json

import pytest

from tilecast.cli import main
from tilecast.cluster.evaluate import evaluate
from tilecast.cluster.hardware import load_cluster
from tilecast.cluster.memory import memory_per_gpu
from tilecast.cluster.search import candidates, expert_parallel_sizes, layout_label, search
from tilecast.cluster.strategy import Strategy
from tilecast.cluster.sweep import sweep, sweep_table
from tilecast.graph.model_config import load_model

H100 = load_cluster("dgx-h100")
MIXTRAL = load_model("mixtral-8x7b")
DEEPSEEK = load_model("deepseek-moe-16b")


def test_ep_sizes_divide_the_experts_and_dp():
    assert expert_parallel_sizes(load_model("gpt3-6.7b"), 64) == [1]
    assert expert_parallel_sizes(MIXTRAL, 32) == [1, 2, 4, 8]
    assert expert_parallel_sizes(MIXTRAL, 12) == [1, 2, 4]  # 8 does not divide 12 data-parallel ranks
    assert expert_parallel_sizes(DEEPSEEK, 48) == [1, 2, 4, 8, 16]  # 64 experts; 32, 64 do not divide 48


def test_search_candidates_span_ep_under_its_constraints():
    cs = candidates(MIXTRAL, H100, 64, 4096, 256)
    eps = {st.ep for st in cs}
    assert eps == {1, 2, 4, 8}
    for st in cs:
        assert MIXTRAL.n_experts % st.ep == 0 and st.dp % st.ep == 0
    # the same layout at each EP: the expert weights per GPU fall as 1/EP, the rest stays
    same = [st for st in cs if (st.tp, st.pp, st.micro_batch, st.zero, st.schedule, st.recompute)
            == (2, 1, 1, 0, "1f1b", "none")]
    assert sorted(st.ep for st in same) == [1, 2, 4, 8]
    mems = {st.ep: memory_per_gpu(MIXTRAL, st, H100) for st in same}
    assert mems[1].params > mems[2].params > mems[4].params > mems[8].params
    assert mems[1].activations == mems[8].activations


def test_dense_candidates_are_those_of_before():
    # a dense model gets EP 1 only, so the layouts and their order are the ones the search always enumerated
    cs = candidates(load_model("gpt3-6.7b"), H100, 64, 2048, 256)
    assert {st.ep for st in cs} == {1}
    assert len(cs) == 864


def test_search_picks_ep_and_its_best_fits():
    res = search(MIXTRAL, H100, 64, 4096, 256, top=3, max_configs=150, progress=False, expert_imbalance=1.2)
    assert res["top"] and all(r.fits for r in res["top"])
    best = res["top"][0]
    assert best.strategy["ep"] > 1  # dividing the experts is what makes Mixtral fit and run fast on 64 H100s
    assert best.strategy["expert_imbalance"] == 1.2  # the recipe reaches every candidate
    assert f"ep{best.strategy['ep']}" in layout_label(best.strategy)
    # EP 1 layouts need the whole 46.7 B-parameter model's states on each rank
    ep1 = Strategy(tp=2, dp=32, seq=4096, global_batch=256, micro_batch=1, zero=1, sequence_parallel=True)
    assert memory_per_gpu(MIXTRAL, ep1, H100).total > memory_per_gpu(MIXTRAL, ep1.with_(ep=8), H100).total + 20e9


def test_ep_sweep_keeps_dp_and_reports_bad_values():
    st = Strategy(tp=2, dp=32, seq=4096, global_batch=256, zero=1)
    df = sweep_table("ep", sweep(MIXTRAL, st, H100, "ep", [1, 3, 8, 16], gpus=64))
    assert list(df["ep"]) == [1, 3, 8, 16]
    assert df["error"].notna().tolist() == [False, True, False, True]  # 3 and 16 do not divide the 8 experts
    ok = df[df["error"].isna()]
    assert ok["memory_per_gpu_bytes"].iloc[0] > ok["memory_per_gpu_bytes"].iloc[1]
    assert ok["ep_comm_s"].iloc[0] == 0 < ok["ep_comm_s"].iloc[1]
    # the EP 8 row is the layout evaluated directly
    r = evaluate(MIXTRAL, st.with_(ep=8), H100)
    assert ok["tokens_per_s"].iloc[1] == pytest.approx(r.tokens_per_s)


def test_cp_sweep_on_fixed_gpus_recomputes_dp():
    llama = load_model("llama3-8b")
    st = Strategy(tp=2, dp=4, seq=16384, global_batch=32)
    rows = sweep(llama, st, H100, "cp", [1, 2, 4], gpus=8)
    assert [r["result"].strategy["dp"] for r in rows] == [4, 2, 1]
    assert all(r["result"].gpus == 8 for r in rows)


def test_cli_search_prints_ep_and_takes_an_ep_baseline(capsys):
    rc = main(["whatif", "--search", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64", "--seq",
               "4096", "--global-batch", "256", "--max-configs", "60", "--top", "2", "--json",
               "--baseline", "tp=2,ep=8,zero=1"])
    assert rc == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["baseline"]["strategy"]["ep"] == 8 and obj["baseline"]["strategy"]["dp"] == 32
    assert obj["gain"] == pytest.approx(obj["top"][0]["tokens_per_s"] / obj["baseline"]["tokens_per_s"])
    rc = main(["whatif", "--search", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64", "--seq",
               "4096", "--global-batch", "256", "--max-configs", "30", "--top", "1"])
    out = capsys.readouterr().out
    assert " ep " in out.splitlines()[1]


def test_cli_ep_baseline_that_cannot_run_is_one_line(capsys):
    rc = main(["whatif", "--search", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64",
               "--global-batch", "256", "--baseline", "tp=2,ep=3"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--baseline" in err and "ep" in err


def test_inference_search_spans_ep_dividing_tp_and_the_sweep_takes_ep():
    from tilecast.cluster.inference import InferenceConfig
    from tilecast.cluster.inference_search import inference_candidates, inference_search, layout_label as label
    from tilecast.cluster.inference_sweep import inference_sweep

    cands = inference_candidates(MIXTRAL, H100, 8)
    assert {(tp, ep) for tp, _, _, ep in cands if tp == 4} == {(4, 1), (4, 2), (4, 4)}
    assert all(tp % ep == 0 and MIXTRAL.n_experts % ep == 0 for tp, _, _, ep in cands)
    assert {ep for *_, ep in inference_candidates(load_model("llama3-8b"), H100, 8)} == {1}
    cfg = InferenceConfig(batch=16, input_len=512, output_len=64)
    res = inference_search(MIXTRAL, H100, cfg, 8, "trtllm-0.9", top=50)
    assert {r.config["ep"] for r in res["top"]} >= {1, 2}
    assert "ep2" in next(label(r) for r in res["top"] if r.config["ep"] == 2)
    rows = inference_sweep(MIXTRAL, InferenceConfig(tp=4, batch=16), H100, "ep", [1, 3, 4], "trtllm-0.9")
    assert "error" in rows[1] and rows[2]["result"].config["ep"] == 4
    # experts over 4 GPUs: the dispatch and combine all-to-alls add communication
    assert rows[2]["result"].breakdown["comm_s"] > rows[0]["result"].breakdown["comm_s"]
