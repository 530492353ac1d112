"""MAD Max-style hardware what-ifs: NVLink domain, NICs per node, HBM capacity/bandwidth, FLOPs; the search's
gain over a baseline layout, alone and per hardware point."""

import json

import pytest

from tilecast.cli import main
from tilecast.cluster.evaluate import evaluate
from tilecast.cluster.hardware import ClusterError, load_cluster
from tilecast.cluster.inference import InferenceConfig
from tilecast.cluster.inference_search import inference_search
from tilecast.cluster.inference_sweep import inference_sweep, inference_sweep_table
from tilecast.graph.model_config import load_model as load_shape
from tilecast.cluster.search import search, search_sweep
from tilecast.cluster.strategy import Strategy
from tilecast.cluster.sweep import parse_values, sweep, sweep_table

H100 = load_cluster("dgx-h100")
GPT3 = load_shape("gpt3-175b")
BIG = Strategy(tp=16, pp=8, dp=2, global_batch=64, recompute="selective", sequence_parallel=True)


def table(shape, st, param, values, cluster=H100):
    return sweep_table(param, sweep(shape, st, cluster, param, values)).to_dict("records")


def test_hardware_values_parse_and_bad_ones_are_refused():
    assert parse_values("nvlink_domain", "4..32") == [4, 8, 16, 32]
    assert parse_values("nics_per_node", "1,2,8") == [1, 2, 8]
    assert parse_values("hbm_gb", "40,80") == [40.0, 80.0]
    for param, text in (("hbm_gb", "0"), ("nvlink_domain", "3.5..7"), ("nics_per_node", "-1")):
        with pytest.raises(ValueError):
            parse_values(param, text)
    with pytest.raises(ClusterError, match="nics_per_node"):
        H100.with_nics(0)


def test_a_larger_nvlink_domain_never_increases_exposed_tp_communication():
    rows = table(GPT3, BIG, "nvlink_domain", [2, 4, 8, 16, 32])
    tp = [r["tp_comm_s"] for r in rows]
    assert all(a >= b for a, b in zip(tp, tp[1:]))
    assert tp[3] < tp[2]  # tp 16 leaves the 8-GPU domain at 8, fits in one at 16
    for r in rows:
        assert 0 < r["exposed_comm_share"] < 1
        assert r["exposed_comm_share"] == pytest.approx(r["exposed_comm_s"] / r["step_s"])
    c = H100.with_scale_up_domain(72)
    assert c.n_gpus >= H100.n_gpus and c.inter_node.bandwidth == H100.inter_node.bandwidth


def test_more_nics_per_node_shrink_exposed_communication():
    st = Strategy(tp=8, pp=4, dp=8, global_batch=64, recompute="selective", sequence_parallel=True)
    rows = table(GPT3, st, "nics_per_node", [1, 2, 4, 8])
    exposed = [r["exposed_comm_s"] for r in rows]
    assert all(a > b for a, b in zip(exposed, exposed[1:]))
    assert rows[0]["exposed_comm_share"] > rows[-1]["exposed_comm_share"]
    assert max(r["compute_s"] for r in rows) == pytest.approx(min(r["compute_s"] for r in rows))  # same GEMMs


def test_hbm_capacity_says_when_the_layout_no_longer_fits():
    rows = table(GPT3, BIG, "hbm_gb", [16, 80, 141])
    assert not rows[0]["fits"]
    assert rows[0]["note"].startswith("does not fit: needs") and "of 17.2 GB" in rows[0]["note"]
    assert rows[1]["fits"] and rows[1]["note"] == "" and rows[2]["note"] == ""
    assert rows[0]["step_s"] == rows[2]["step_s"]  # capacity alone changes no time


def test_flops_and_hbm_bandwidth_change_what_they_should():
    st = Strategy(tp=8, pp=4, dp=8, global_batch=64, recompute="selective", sequence_parallel=True)
    f = table(GPT3, st, "flops", [1, 2])
    assert f[1]["compute_s"] < 0.6 * f[0]["compute_s"]
    shape = load_shape("llama3-70b")
    cfg = InferenceConfig(tp=8, batch=16, input_len=512, output_len=64)
    rows = inference_sweep_table("hbm_bw", inference_sweep(shape, cfg, H100, "hbm_bw", [1, 2], "trtllm-0.9"))
    assert rows["memory_s"][1] < rows["memory_s"][0] and rows["tpot_s"][1] < rows["tpot_s"][0]


def test_inference_sweeps_of_the_domain_and_capacity():
    shape = load_shape("llama3-70b")
    cfg = InferenceConfig(tp=8, batch=64, input_len=1024, output_len=128)
    rows = inference_sweep_table("nvlink_domain", inference_sweep(shape, cfg, H100, "nvlink_domain", [4, 8, 16],
                                                                  "trtllm-0.9")).to_dict("records")
    assert "exceeds the 4 GPUs of a node" in rows[0]["error"]
    assert rows[1]["comm_s"] == pytest.approx(rows[2]["comm_s"])  # tp 8 inside the domain either way
    parts = sum(rows[1][k] for k in ("compute_s", "memory_s", "comm_s", "overhead_s", "pipeline_idle_s"))
    assert 0 < rows[1]["exposed_comm_share"] < 1
    assert rows[1]["exposed_comm_share"] == pytest.approx(rows[1]["comm_s"] / parts)  # pp 1: the parts make the time
    cap = inference_sweep_table("hbm_gb", inference_sweep(shape, cfg, H100, "hbm_gb", [20, 80], "trtllm-0.9"))
    assert not cap["fits"][0] and cap["note"][0].startswith("does not fit") and cap["fits"][1]


def _strategy(d):
    return Strategy(**{**d, "stage_layers": tuple(d["stage_layers"])})


def test_search_gain_is_the_ratio_of_the_two_evaluated_layouts():
    shape = load_shape("gpt3-6.7b")
    base = Strategy(tp=8, pp=1, dp=2, global_batch=64)
    res = search(shape, H100, 16, 2048, 64, top=3, max_configs=40, progress=False, baseline=base)
    best = evaluate(shape, _strategy(res["top"][0].strategy), H100)
    again = evaluate(shape, base, H100)
    assert res["gain"] == pytest.approx(best.tokens_per_s / again.tokens_per_s, rel=1e-12)
    assert res["gain"] >= 1.0 or not again.fits
    rows = search_sweep(shape, H100, 16, 2048, 64, "nics_per_node", [1, 8], baseline=base, max_configs=40)
    for row in rows:
        assert row["gain"] == pytest.approx(row["best"].tokens_per_s / row["baseline"].tokens_per_s)
        assert row["gain_vs_base_hardware"] == pytest.approx(row["best"].tokens_per_s / again.tokens_per_s)
    assert rows[1]["best"].tokens_per_s >= rows[0]["best"].tokens_per_s


def test_inference_search_gain_is_the_ratio_of_the_two_configurations():
    shape = load_shape("llama3-8b")
    tmpl = InferenceConfig(batch=32, input_len=512, output_len=128)
    base = InferenceConfig(tp=8, dp=1, batch=32, input_len=512, output_len=128)
    res = inference_search(shape, H100, tmpl, 8, "trtllm-0.9", baseline=base)
    assert res["gain"] == pytest.approx(res["top"][0].tokens_per_s / res["baseline"].tokens_per_s)
    assert res["gain"] > 1  # eight replicas of a model that fits one GPU beat one TP-8 replica at the same batch


def run(capsys, argv):
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap


def test_cli_search_with_baseline_and_hardware_sweep(capsys):
    rc, cap = run(capsys, ["whatif", "--search", "--cluster", "dgx-h100", "--model", "gpt3-6.7b", "--gpus", "16",
                           "--global-batch", "64", "--max-configs", "30", "--baseline", "tp=8,pp=1,dp=...",
                           "--sweep", "nvlink_domain=8,16", "--json"])
    assert rc == 0
    obj = json.loads(cap.out)
    assert obj["baseline"]["strategy"]["tp"] == 8 and obj["baseline"]["strategy"]["dp"] == 2
    assert obj["gain"] == pytest.approx(obj["top"][0]["tokens_per_s"] / obj["baseline"]["tokens_per_s"])
    rows = obj["search_sweeps"]["nvlink_domain"]
    assert [r["nvlink_domain"] for r in rows] == [8, 16]
    assert rows[0]["gain"] == pytest.approx(rows[0]["tokens_per_s"] / rows[0]["baseline_tokens_per_s"])
    rc, cap = run(capsys, ["whatif", "--inference", "--search", "--cluster", "dgx-h100", "--model", "llama3-70b",
                           "--gpus", "8", "--batch", "0", "--dtype", "fp8", "--baseline", "tp=8", "--json"])
    obj = json.loads(cap.out)
    assert rc == 0 and obj["baseline"]["config"]["tp"] == 8
    assert obj["gain"] == pytest.approx(obj["top"][0]["tokens_per_s"] / obj["baseline"]["tokens_per_s"])


@pytest.mark.parametrize("baseline", ["tp=abc", "foo=1", "tp8", "tp=3", "tp=8,dp=5"])
@pytest.mark.parametrize("inference", [False, True])
def test_a_bad_baseline_is_one_line_naming_the_flag(capsys, baseline, inference):
    argv = ["whatif", "--search", "--model", "gpt3-6.7b", "--gpus", "16", "--global-batch", "64",
            "--baseline", baseline] + (["--inference"] if inference else [])
    rc, cap = run(capsys, argv)
    lines = cap.err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "--baseline" in lines[0], cap.err
    assert "Traceback" not in cap.err


def test_cli_hardware_sweep_rows_and_plot(capsys, tmp_path):
    png = tmp_path / "s.png"
    rc, cap = run(capsys, ["whatif", "--inference", "--cluster", "dgx-h100", "--model", "llama3-70b", "--tp", "8",
                           "--batch", "32", "--sweep", "nics_per_node=4,8", "--sweep", "hbm_gb=16,80",
                           "--plot", str(png), "--json"])
    obj = json.loads(cap.out)
    assert png.stat().st_size > 10_000
    assert all("exposed_comm_share" in r and "note" in r for r in obj["sweeps"]["hbm_gb"])
    assert obj["sweeps"]["hbm_gb"][0]["fits"] is False


def test_gqa_kv_rereads_run_at_the_dies_rate_not_the_hbms():
    """The H200 is the H100 die with faster HBM: decode attention's re-reads of a KV head (served on die)
    do not speed up with it, the KV cache's first read does."""
    from dataclasses import replace as dc_replace

    from tilecast.cluster.inference_costs import engine_efficiency, layer_pass

    shape = load_shape("llama3-8b")  # 4 query heads per KV head
    h200 = load_cluster("dgx-h200")
    assert h200.gpu.cache_reread_bandwidth == H100.gpu.memory_bandwidth == H100.gpu.cache_reread_bandwidth

    def kv_read_s(cluster, reread):
        eff = dc_replace(engine_efficiency("trtllm-0.9"), kv_group_reread=reread)
        kw = dict(tp=1, seqs=16, new_tokens=1, context=8192, weight_dtype="fp8", kv_dtype="fp8", eff=eff)
        return float(layer_pass(shape, cluster, **kw).memory_s)

    ratio = H100.gpu.memory_bandwidth / h200.gpu.memory_bandwidth
    assert kv_read_s(h200, 0.0) == pytest.approx(kv_read_s(H100, 0.0) * ratio, rel=1e-9)
    assert kv_read_s(h200, 0.5) > kv_read_s(H100, 0.5) * ratio * 1.05
    faster_hbm = H100.scaled(hbm_bandwidth=2.0)  # an HBM what-if leaves the on-die rate
    assert faster_hbm.gpu.cache_reread_bandwidth == H100.gpu.memory_bandwidth


def test_a100_rereads_run_at_its_l2_rate_relative_to_the_h100s():
    """The re-read rate is stated against the H100 die whose rows fitted ``kv_group_reread``: the A100's is
    the H100's scaled by the two dies' L2 bandwidths (7,219 / 8,986 GB/s), above its own HBM figure."""
    a100 = load_cluster("dgx-a100")
    assert a100.gpu.cache_reread_bandwidth == pytest.approx(H100.gpu.cache_reread_bandwidth * 7219 / 8986, rel=1e-3)
    assert a100.gpu.cache_reread_bandwidth > a100.gpu.memory_bandwidth * 1.3


def test_fused_attention_pads_the_head_dimension_as_its_kernels_do():
    from tilecast.cluster.flops import fused_attention_head_padding

    assert fused_attention_head_padding(112) == pytest.approx(128 / 112)  # the released MPT-30B checkpoint
    assert [fused_attention_head_padding(d) for d in (64, 128, 160, 256)] == [1.0] * 4
    assert fused_attention_head_padding(200) == pytest.approx(256 / 200)
    mpt30, mpt70 = load_shape("mpt-30b"), load_shape("mpt-70b")
    assert mpt30.head_dim == 128 and mpt70.head_dim == 128  # llm-foundry's mpt-30b.yaml: 56 heads of 128


@pytest.mark.parametrize("inference", [False, True])
def test_baseline_without_search_is_refused(capsys, inference):
    rc, cap = run(capsys, ["whatif", "--model", "gpt3-6.7b", "--gpus", "16", "--baseline", "tp=8"]
                  + (["--inference"] if inference else []))
    assert rc == 2 and cap.err.strip() == "tilecast whatif: --baseline: only with --search"
