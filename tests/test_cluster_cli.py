"""`tilecast whatif` and `tilecast validate` end to end."""

import json

import pytest

from tilecast.cli import main


def run_json(capsys, argv):
    rc = main(argv)
    out = capsys.readouterr().out
    return rc, json.loads(out)


def test_whatif_json_has_the_contract_fields(capsys):
    rc, obj = run_json(capsys, ["whatif", "--cluster", "dgx-h100", "--model", "gpt3-175b", "--gpus", "512",
                                "--tp", "8", "--pp", "8", "--global-batch", "512", "--recompute", "selective",
                                "--sequence-parallel", "--schedule", "interleaved", "--virtual-stages", "2", "--json"])
    assert rc == 0
    for k in ("step_s", "tokens_per_s", "tflops_per_gpu", "mfu", "breakdown", "memory_per_gpu_bytes", "fits"):
        assert k in obj
    assert obj["gpus"] == 512 and obj["strategy"]["dp"] == 8
    assert obj["tokens_per_s"] == pytest.approx(512 * 2048 / obj["step_s"])
    b = obj["breakdown"]
    assert b["compute_s"] + b["exposed_comm_s"] + b["bubble_s"] + b["optimizer_s"] == pytest.approx(obj["step_s"])
    assert obj["fits"] is (obj["memory_per_gpu_bytes"] <= obj["memory_capacity_bytes"])


def test_whatif_flags_configurations_that_do_not_fit(capsys):
    rc, obj = run_json(capsys, ["whatif", "--model", "gpt3-175b", "--gpus", "8", "--tp", "8", "--json"])
    assert rc == 0 and obj["fits"] is False


def test_whatif_sweep_network_bandwidth_and_plot(capsys, tmp_path):
    png = tmp_path / "sweep.png"
    rc, obj = run_json(capsys, ["whatif", "--model", "gpt2-xl", "--seq", "1024", "--gpus", "256", "--micro-batch", "4",
                                "--global-batch", "1024", "--sweep", "network_bw=x0.5..x4", "--plot", str(png), "--json"])
    assert rc == 0
    rows = obj["sweeps"]["network_bw"]
    assert [r["network_bw"] for r in rows] == [0.5, 1.0, 2.0, 4.0]
    steps = [r["step_s"] for r in rows]
    assert steps == sorted(steps, reverse=True)
    assert png.stat().st_size > 1000


def test_whatif_table_output(capsys):
    assert main(["whatif", "--model", "mpt-7b", "--gpus", "8", "--zero", "3", "--micro-batch", "4",
                 "--global-batch", "64", "--sweep", "zero=0,1,2,3"]) == 0
    out = capsys.readouterr().out
    assert "tokens/s" in out and "MFU" in out and "sweep of zero" in out


def test_whatif_search_prints_fitting_layouts(capsys):
    rc, obj = run_json(capsys, ["whatif", "--search", "--model", "gpt3-175b", "--gpus", "256",
                                "--global-batch", "256", "--top", "3", "--max-configs", "40", "--json"])
    assert rc == 0
    assert obj["evaluated"] <= 40 and 0 < len(obj["top"]) <= 3
    assert all(r["fits"] for r in obj["top"])
    tps = [r["tokens_per_s"] for r in obj["top"]]
    assert tps == sorted(tps, reverse=True)


@pytest.mark.parametrize("argv, word", [
    (["--gpus", "1000", "--tp", "8", "--pp", "8"], "--gpus"),
    (["--schedule", "zigzag"], "--schedule"),
    (["--cluster", "dgx-z"], "--cluster"),
    (["--model", "gpt9"], "model"),
    (["--tp", "3", "--model", "gpt3-175b"], "--tp"),
    (["--sweep", "warp_drive=1,2"], "--sweep"),
    (["--search"], "--search"),
])
def test_whatif_bad_input_is_one_line_exit_2(capsys, argv, word):
    assert main(["whatif"] + argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and word in err[0]


def test_validate_command_meets_its_target(capsys):
    rc, obj = run_json(capsys, ["validate", "--json"])
    runs = obj["runs"]
    assert len(runs) >= 8 and len(obj["sources"]) >= 2
    assert rc == 0 and obj["ok"] and obj["median_abs_error"] <= 0.10
    assert {r["role"] for r in runs} == {"calibration", "validation"}


def test_validate_rejects_excluded_publications(capsys, tmp_path):
    bad = tmp_path / "runs.yaml"
    bad.write_text("runs:\n  - {id: x, source: narayanan-2021, cluster: dgx-a100, model: gpt3-175b, gpus: 8, dp: 8,"
                   " seq: 2048, global_batch: 8, micro_batch: 1, metric: step_s, published: 1, role: validation}\n")
    assert main(["validate", "--table", str(bad)]) == 2
    assert "kept out" in capsys.readouterr().err


def test_whatif_trace_uses_the_trace_schema(capsys, tmp_path):
    from tilecast.trace import load

    path = tmp_path / "step.parquet"
    rc, obj = run_json(capsys, ["whatif", "--model", "gpt3-175b", "--gpus", "256", "--tp", "8", "--pp", "4",
                                "--global-batch", "64", "--trace", str(path), "--json"])
    assert rc == 0
    df = load(str(path))
    assert len(df) == obj["n_tasks"] and set(df["node"]) == {0, 1, 2, 3}
    assert df["end_s"].max() == pytest.approx(obj["step_s"])
    # stage 0 runs 8 micro-batches forward and backward on its compute stream
    s0 = df[(df.node == 0) & (df.kernel == "compute")]
    assert sum(t.startswith("F") for t in s0.tag) == 8 and sum(t.startswith("B") for t in s0.tag) >= 8
