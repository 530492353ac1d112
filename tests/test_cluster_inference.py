"""Serving what-if (tilecast.cluster.inference*): KV cache, memory, prefill/decode times, validation."""

import json

import pytest

from tilecast.cli import main
from tilecast.cluster.hardware import load_cluster
from tilecast.cluster.inference import InferenceConfig, InferenceError, evaluate_inference
from tilecast.cluster.inference_costs import engine_efficiency, load_engines, tp_all_reduce
from tilecast.cluster.inference_memory import (inference_memory, kv_bytes_per_token, kv_heads_per_rank,
                                               largest_batch, weight_bytes)
from tilecast.cluster.inference_validation import (compare_inference, load_inference_runs, median_abs_error)
from tilecast.graph.model_config import load_model


@pytest.fixture(scope="module")
def h100():
    return load_cluster("dgx-h100")


@pytest.fixture(scope="module")
def llama70b():
    return load_model("llama3-70b")  # 80 layers, 64 query heads, 8 key/value heads of 128


def test_kv_cache_bytes_of_a_gqa_model_by_hand(llama70b):
    # 2 (K and V) x 8 heads x 128 x 2 bytes x 80 layers = 327,680 bytes per token on one GPU
    assert kv_bytes_per_token(llama70b, tp=1, pp=1, kv_dtype="bf16") == 2 * 8 * 128 * 2 * 80 == 327_680
    # not the 64 query heads: a multi-head model of the same width would need 8x more
    mha = load_model(json.dumps({"n_layer": 80, "n_embd": 8192, "n_head": 64, "vocab_size": 128256,
                                 "n_positions": 8192}))
    assert kv_bytes_per_token(mha, 1, 1, "bf16") == 8 * kv_bytes_per_token(llama70b, 1, 1, "bf16")
    assert kv_bytes_per_token(llama70b, tp=4, pp=1, kv_dtype="bf16") == 327_680 / 4  # 2 KV heads per rank
    assert kv_bytes_per_token(llama70b, tp=1, pp=2, kv_dtype="fp8") == 327_680 / 4  # 40 layers, 1 byte
    # tp beyond the KV heads: each rank keeps a copy of one head
    assert kv_heads_per_rank(llama70b, 16) == 1
    assert kv_bytes_per_token(llama70b, tp=16, pp=1, kv_dtype="bf16") == 327_680 / 8


def test_largest_batch_is_the_last_that_fits(h100, llama70b):
    kw = dict(tp=4, pp=1, weight_dtype="fp8", kv_dtype="fp8")
    b = largest_batch(llama70b, h100, input_len=2048, output_len=2048, **kw)
    assert b > 1

    def total(n):
        return inference_memory(llama70b, h100, batch=n, context=4096, prefill_tokens=n * 2048, **kw).total

    assert total(b) <= h100.gpu.memory_bytes < total(b + 1)
    # without the whole batch's prefill workspace (continuous batching) more fit, and an fp8 KV cache
    # holds about twice the sequences of a bf16 one
    b8, b16 = (largest_batch(llama70b, h100, input_len=2048, output_len=2048, tp=4, pp=1, weight_dtype="fp8",
                             kv_dtype=kv, prefill_tokens_per_sequence=0) for kv in ("fp8", "bf16"))
    assert b8 > b and 1.9 < b8 / b16 < 2.1
    # the model alone does not fit on one 80 GB GPU in bf16
    assert largest_batch(llama70b, h100, input_len=128, output_len=128, tp=1, pp=1, weight_dtype="bf16",
                         kv_dtype="bf16") == 0


def test_tensor_parallelism_reduces_memory_per_gpu(h100, llama70b):
    w1, w4 = (weight_bytes(llama70b, tp, 1, "bf16") for tp in (1, 4))
    assert w4 == pytest.approx(w1 / 4)
    assert 2 * 70.0e9 < w1 < 2 * 71.5e9  # 70.6 B parameters in 2 bytes
    r1, r4 = (evaluate_inference(llama70b, InferenceConfig(tp=tp, batch=8, input_len=512, output_len=512),
                                 h100) for tp in (2, 8))
    assert r4.memory["weights"] < r1.memory["weights"] / 3.9
    assert r4.memory["kv_cache"] == pytest.approx(r1.memory["kv_cache"] / 4)
    assert r4.memory_per_gpu_bytes < r1.memory_per_gpu_bytes
    assert r4.max_batch > r1.max_batch


def test_decode_time_scales_with_hbm_bandwidth(h100):
    shape = load_model("llama2-7b")
    cfg = InferenceConfig(batch=1, input_len=128, output_len=64)
    base = evaluate_inference(shape, cfg, h100)
    fast = evaluate_inference(shape, cfg, h100.scaled(hbm_bandwidth=2.0))
    ratio = fast.tpot_s / base.tpot_s
    # memory-bound: the HBM part halves; only the small fixed overheads stay
    overhead = base.decode["overhead_s"] / base.decode["steps"]
    assert ratio == pytest.approx((base.tpot_s - overhead) / 2 / base.tpot_s + overhead / base.tpot_s, rel=0.02)
    assert 0.5 <= ratio < 0.6
    assert base.breakdown["memory_s"] > 5 * base.breakdown["compute_s"]
    # a long prefill is compute-bound: more bandwidth barely changes the time to first token
    long = InferenceConfig(batch=16, input_len=2048, output_len=2)
    assert (evaluate_inference(shape, long, h100.scaled(hbm_bandwidth=2.0)).ttft_s
            > 0.9 * evaluate_inference(shape, long, h100).ttft_s)
    # ... and more flops do
    assert (evaluate_inference(shape, long, h100.scaled(flops=2.0)).ttft_s
            < 0.7 * evaluate_inference(shape, long, h100).ttft_s)


def test_small_tp_all_reduce_is_latency_bound(h100):
    t_small = tp_all_reduce(8192 * 2, 8, h100)
    assert t_small == pytest.approx(h100.intra_node.latency, rel=0.1)  # one-shot: one latency
    assert tp_all_reduce(8192 * 2, 8, h100, one_shot=False) > 3 * t_small  # NCCL's ring/tree: several steps
    assert tp_all_reduce(8192 * 2, 1, h100) == 0.0


def test_fixed_batch_figures_are_consistent(h100, llama70b):
    cfg = InferenceConfig(tp=4, batch=32, input_len=1024, output_len=256, weight_dtype="fp8", kv_dtype="fp8")
    r = evaluate_inference(llama70b, cfg, h100)
    assert r.mode == "fixed-batch" and r.fits and not r.overloaded
    assert r.request_latency_s == pytest.approx(r.ttft_s + 255 * r.tpot_s)
    assert r.tokens_per_s == pytest.approx(32 * 256 / r.request_latency_s)
    assert r.tokens_per_s_per_gpu == pytest.approx(r.tokens_per_s / 4)
    b = r.breakdown
    assert b["compute_s"] + b["memory_s"] + b["comm_s"] + b["overhead_s"] == pytest.approx(b["total_s"])
    assert b["comm_s"] > 0  # TP all-reduces
    big = evaluate_inference(llama70b, InferenceConfig(**{**cfg.to_dict(), "batch": 0}), h100)
    assert big.batch == big.max_batch and big.tokens_per_s > r.tokens_per_s
    dp2 = evaluate_inference(llama70b, InferenceConfig(**{**cfg.to_dict(), "dp": 2}), h100)
    assert dp2.tokens_per_s == pytest.approx(2 * r.tokens_per_s) and dp2.ttft_s == pytest.approx(r.ttft_s)


def test_pipeline_parallelism_splits_layers_and_pipelines_micro_batches(h100, llama70b):
    one = evaluate_inference(llama70b, InferenceConfig(tp=4, batch=16, input_len=256, output_len=64), h100)
    two = evaluate_inference(llama70b, InferenceConfig(tp=4, pp=2, batch=16, input_len=256, output_len=64), h100)
    assert two.memory["weights"] < 0.56 * one.memory["weights"]
    assert two.memory["kv_cache"] == pytest.approx(one.memory["kv_cache"] / 2)
    # memory-bound decode: each of the 2 micro-batches re-reads its stage's weights, so an iteration takes
    # about as long as pp = 1's (no faster on twice the GPUs, but no slower: the stages run at once)
    assert two.tpot_s == pytest.approx(one.tpot_s, rel=0.15)
    # compute-bound prefill: 3 passes of half the sequences through half the layers, 0.75 of pp = 1's
    assert two.ttft_s == pytest.approx(0.75 * one.ttft_s, rel=0.15)


def test_continuous_batching_obeys_littles_law_and_saturates(h100):
    shape = load_model("llama3-8b")
    kw = dict(input_len=512, output_len=256, weight_dtype="fp8", kv_dtype="fp8")
    light = evaluate_inference(shape, InferenceConfig(request_rate=5.0, **kw), h100)
    heavy = evaluate_inference(shape, InferenceConfig(request_rate=40.0, **kw), h100)
    for r, rate in ((light, 5.0), (heavy, 40.0)):
        assert r.mode == "continuous" and not r.overloaded
        assert r.tokens_per_s == pytest.approx(rate * 256)
        assert r.batch == pytest.approx(rate * 256 * r.tpot_s, rel=1e-3)  # Little's law
    assert heavy.tpot_s > light.tpot_s and heavy.ttft_s > light.ttft_s
    over = evaluate_inference(shape, InferenceConfig(request_rate=1000.0, max_batch=256, **kw), h100)
    assert over.overloaded and over.batch == 256 and over.tokens_per_s < 1000.0 * 256
    assert over.to_dict()["ttft_s"] is None  # unbounded queueing


def test_bad_configurations_name_their_field(h100, llama70b):
    with pytest.raises(InferenceError, match="^tp: 3"):
        InferenceConfig(tp=3).check(llama70b, h100)
    with pytest.raises(InferenceError, match="^kv_dtype"):
        InferenceConfig(kv_dtype="int4").check(llama70b, h100)
    with pytest.raises(InferenceError, match="^request_rate"):
        InferenceConfig(request_rate=-1.0).check(llama70b, h100)
    with pytest.raises(InferenceError, match="^batch: not even one"):
        evaluate_inference(llama70b, InferenceConfig(batch=0), h100)
    with pytest.raises(ValueError, match="^engine: unknown"):
        engine_efficiency("nope")


def test_engine_profiles_are_checked(tmp_path):
    engines = load_engines()
    assert {"trtllm-0.6", "trtllm-0.5", "nemo", "argonne-trtllm", "argonne-vllm"} <= set(engines)
    assert all(e.sources for e in engines.values())  # every fitted profile names its rows
    bad = tmp_path / "e.yaml"
    bad.write_text("engines:\n  x: {decode_hbm_efficiency: 1.5}\n")
    with pytest.raises(ValueError, match="decode_hbm_efficiency"):
        load_engines(str(bad))
    bad.write_text("engines:\n  x: {warp_speed: 2}\n")
    with pytest.raises(ValueError, match="unknown field warp_speed"):
        load_engines(str(bad))


def test_validation_error_is_computed_over_the_table(tmp_path, h100):
    shape = load_model("llama2-7b")
    pred = evaluate_inference(shape, InferenceConfig(batch=4, input_len=128, output_len=32), h100,
                              "trtllm-0.6").tokens_per_s_per_gpu  # the rows' source names their engine
    table = tmp_path / "t.yaml"
    table.write_text(
        "runs:\n"
        f"  - {{id: a, source: trtllm-0.6, cluster: dgx-h100, model: llama2-7b, batch: 4, input_len: 128,"
        f" output_len: 32, metric: tokens_per_s_per_gpu, published: {pred / 1.25}, role: validation}}\n"
        f"  - {{id: b, source: trtllm-0.6, cluster: dgx-h100, model: llama2-7b, batch: 4, input_len: 128,"
        f" output_len: 32, metric: tokens_per_s_per_gpu, published: {pred / 0.9}, role: validation}}\n"
        f"  - {{id: c, source: trtllm-0.6, cluster: dgx-h100, model: llama2-7b, batch: 4, input_len: 128,"
        f" output_len: 32, metric: tokens_per_s_per_gpu, published: {pred}, role: calibration}}\n")
    df = compare_inference(load_inference_runs(str(table)))
    assert list(df.error.round(6)) == [0.25, -0.1, 0.0]
    assert median_abs_error(df) == pytest.approx(0.1)
    assert median_abs_error(df[df.role == "validation"]) == pytest.approx(0.175)


def test_shipped_table_meets_the_inference_targets():
    runs = load_inference_runs()
    df = compare_inference(runs)
    val = df[df.role == "validation"]
    assert len(val) >= 10 and df.source.nunique() >= 2
    assert set(df.source) >= {"trtllm-0.6", "argonne-vllm"}  # two publishers: NVIDIA and Argonne
    assert median_abs_error(val) <= 0.15
    # the second inference target (none beyond 35%) is not met by a few H200 rows and by the mixture-of-experts
    # rows (Mixtral: -53% to +57%, validation/README.md); this guards against more of them or worse
    dense = val[~val.id.str.contains("mixtral")]
    assert (dense.error.abs() > 0.35).mean() <= 0.05 and dense.error.abs().max() <= 0.60
    moe = val[val.id.str.contains("mixtral")]
    assert len(moe) == 12 and moe.error.abs().median() <= 0.25 and moe.error.abs().max() <= 0.60


def test_cli_inference_json_and_exit_codes(capsys):
    rc = main(["whatif", "--inference", "--cluster", "dgx-h100", "--model", "llama3-70b", "--tp", "4",
               "--dtype", "fp8", "--batch", "16", "--input-len", "512", "--output-len", "128", "--json"])
    obj = json.loads(capsys.readouterr().out)
    assert rc == 0 and obj["fits"] and obj["engine"] == "trtllm-0.9"
    for k in ("tokens_per_s", "ttft_s", "tpot_s", "memory_per_gpu_bytes", "breakdown", "memory", "max_batch",
              "kv_bytes_per_token"):
        assert k in obj
    assert obj["config"]["kv_dtype"] == "fp8" and obj["gpus"] == 4
    # does not fit: exit 1 with the memory it would need
    assert main(["whatif", "--inference", "--model", "llama3-70b", "--batch", "4"]) == 1
    assert "DOES NOT FIT" in capsys.readouterr().out
    # bad input: one line naming the flag, exit 2
    for argv, flag in ((["--tp", "3"], "--tp"), (["--kv-dtype", "int4"], "--kv-dtype"),
                       (["--engine", "x"], "--engine"), (["--sweep", "zero=1,2"], "--sweep"),
                       (["--search"], "--search"),
                       (["--input-len", "0"], "--input-len"), (["--request-rate", "-2"], "--request-rate")):
        assert main(["whatif", "--inference", "--model", "llama3-8b"] + argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and flag in err[0]


def test_cli_inference_sweep_of_hbm_bandwidth(capsys):
    rc = main(["whatif", "--inference", "--cluster", "dgx-h100", "--model", "llama3-8b", "--batch", "4",
               "--input-len", "256", "--output-len", "256", "--sweep", "hbm_bw=x1..x4", "--sweep", "tp=1,3",
               "--json"])
    obj = json.loads(capsys.readouterr().out)
    assert rc == 0
    rows = obj["sweeps"]["hbm_bw"]
    assert [r["hbm_bw"] for r in rows] == [1.0, 2.0, 4.0]
    tpot = [r["tpot_s"] for r in rows]
    assert tpot[0] > tpot[1] > tpot[2] and tpot[2] > tpot[0] / 4  # memory-bound, with fixed overheads
    tp = obj["sweeps"]["tp"]
    assert tp[0]["fits"] and "does not divide" in tp[1]["error"]


def test_validate_prints_the_inference_table(capsys):
    rc = main(["validate", "--json"])
    obj = json.loads(capsys.readouterr().out)
    inf = obj["inference"]
    assert inf["median_abs_error_validation_rows"] <= 0.15 and len(inf["sources"]) >= 2
    assert inf["ok"] == (not inf["rows_beyond_max_error"])
    assert rc == (0 if obj["ok"] else 1)


def test_validate_without_inference_validation_rows_gives_no_verdict(capsys):
    rc = main(["validate", "--role", "calibration"])
    out = capsys.readouterr().out
    assert rc == 0 and "no validation row among them, so no verdict" in out and "nan%" not in out
    main(["validate", "--role", "calibration", "--json"])
    inf = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))["inference"]
    assert inf["median_abs_error_validation_rows"] is None and inf["max_abs_error_validation_rows"] is None
    assert inf["runs"] and {r["role"] for r in inf["runs"]} == {"calibration"}


def test_shipped_engine_figures_are_what_the_calibration_rows_give():
    from dataclasses import replace

    from tilecast.cluster.inference_calibrate import FITTED, INHERITS, TAKES, fit_engine

    shipped = load_engines()
    runs = load_inference_runs()
    for engine, names in FITTED.items():
        base = dict(shipped)
        parent = INHERITS.get(engine)
        if parent:  # the parent's shipped figures, as the calibration takes them over
            take = TAKES.get(engine) or [n for n in FITTED[parent] if n not in names]
            base[engine] = replace(base[engine], **{n: getattr(shipped[parent], n) for n in take})
        fitted, ids, _ = fit_engine(engine, runs=runs, engines=base)
        assert set(ids) == {r.id for r in runs if r.engine == engine and r.role == "calibration"}
        assert shipped[engine].sources.replace(" ", "").split(",") == ids
        for n in names:
            assert getattr(fitted, n) == pytest.approx(getattr(shipped[engine], n), rel=0.03, abs=1e-9), (engine, n)


def test_api_whatif_inference_equals_the_command(capsys):
    import tilecast as tc

    r = tc.whatif_inference(model="llama3-8b", cluster="dgx-h100", dtype="fp8", batch=8, input_len=512,
                            output_len=64)
    rc = main(["whatif", "--inference", "--model", "llama3-8b", "--cluster", "dgx-h100", "--dtype", "fp8",
               "--batch", "8", "--input-len", "512", "--output-len", "64", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and r.tokens_per_s == doc["tokens_per_s"] and r.tpot_s == doc["tpot_s"]
    assert r.engine == doc["engine"] and r.to_frame().loc[0, "ttft_s"] == doc["ttft_s"]
    assert "output tokens/s" in r._repr_html_()
    with pytest.raises(ValueError, match="^tp: 3"):
        tc.whatif_inference(model="llama3-8b", tp=3)


def test_a_serving_engines_vendor_attention_runs_at_the_peak_where_the_gpu_has_one():
    from tilecast.cluster.inference_costs import attention_fraction

    h100, a100 = load_cluster("dgx-h100").gpu, load_cluster("dgx-a100").gpu
    assert attention_fraction(h100, "peak", "bf16") * max(h100.matmul_efficiency["bf16"].fraction) == pytest.approx(1.0)
    assert attention_fraction(h100, "cudnn", "bf16") == h100.attention_fraction("cudnn") < 0.5
    assert attention_fraction(a100, "peak", "bf16") == a100.attention_fraction("flash")  # no vendor kernel fitted
    assert load_engines()["trtllm-0.9"].attention == "peak"
