"""``tilecast compare``: JSON output, report folder, one-line errors with exit status 2."""

import json
import os

import pytest

import tilecast.cli as cli
from synthetic_traces import schedule
from tilecast.trace import save


@pytest.fixture
def tilecast(monkeypatch):
    """The real ``tilecast`` entry point, with only the compare subcommand registered."""
    monkeypatch.setattr(cli, "COMMANDS", {"compare": "compare_cmd"})
    return cli.main


@pytest.fixture
def traces(tmp_path):
    pred = save(schedule("sim"), str(tmp_path / "pred.parquet"))
    real = save(schedule("real", {"gemm": 1.2}), str(tmp_path / "real.csv"))
    return pred, real


def test_json_output_parses(tilecast, traces, tmp_path, capsys):
    out = tmp_path / "rep"
    assert tilecast(["compare", *traces, "--out", str(out), "--json"]) == 0
    stdout = capsys.readouterr().out
    s = json.loads(stdout)
    assert s["makespan"]["error"] == pytest.approx((25 - 29) / 29, rel=1e-9)
    assert (out / "report.html").stat().st_size > 0
    assert s["files"]["html"] == str(out / "report.html")


def test_human_output_names_the_worst_kernel(tilecast, traces, tmp_path, capsys):
    assert tilecast(["compare", *traces, "--out", str(tmp_path / "rep")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("step") and "not recorded with PRED and REAL" in lines[0]  # real.csv: not kept
    assert lines[1].startswith("makespan") and "error -13.79%" in lines[1]
    assert any(line.startswith("gemm") and "-16.67%" in line for line in lines)


def test_step_times_recorded_in_the_traces_come_first(tilecast, tmp_path, capsys):
    from tilecast.trace import with_step_time

    # the step took 25 + 3 ms predicted, 29 + 6 ms measured: the makespan error (-13.79%) understates the miss
    pred = save(with_step_time(schedule("sim"), 0.028), str(tmp_path / "pred.parquet"))
    real = save(with_step_time(schedule("real", {"gemm": 1.2}), 0.035), str(tmp_path / "real.parquet"))
    assert tilecast(["compare", pred, real, "--out", str(tmp_path / "rep")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("step") and "error -20.00%" in lines[0]
    assert "25.000 / 29.000 ms" in lines[1] and "host 3.000 / 6.000 ms" in lines[1]
    assert lines[2].startswith("makespan") and "error -13.79%" in lines[2]
    assert tilecast(["compare", pred, real, "--out", str(tmp_path / "rep"), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert list(s)[0] == "step"
    assert s["step"]["error"] == pytest.approx((28 - 35) / 35)
    assert s["step"]["real_host_s"] == pytest.approx(0.006) and s["step"]["pred_makespan_s"] == pytest.approx(0.025)
    with open(s["files"]["html"], encoding="utf-8") as f:
        page = f.read()
    assert "Step time: predicted 28.000 ms, measured 35.000 ms" in page
    assert page.index("Step time") < page.index("Makespan of the traced step") < page.index("kernels</h2>")


@pytest.mark.parametrize("bad, message", [
    ("missing", "no file"),
    ("garbage", "cannot read"),
    ("swapped", "PRED: expected source 'sim'"),
    ("other_graph", "share no task id"),
])
def test_bad_input_is_one_line_and_exit_2(tilecast, traces, tmp_path, capsys, bad, message):
    pred, real = traces
    if bad == "missing":
        real = str(tmp_path / "nope.parquet")
    elif bad == "garbage":
        real = str(tmp_path / "garbage.parquet")
        (tmp_path / "garbage.parquet").write_bytes(b"not a parquet file at all")
    elif bad == "swapped":
        pred, real = real, pred
    else:
        other = schedule("real")
        other["task"] += 1000
        real = save(other, str(tmp_path / "other.parquet"))
    assert tilecast(["compare", pred, real, "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tilecast compare: ") and message in err and "\n" not in err


def test_before_prediction_is_reported(tilecast, traces, tmp_path, capsys):
    pred, real = traces
    after = save(schedule("sim", {"gemm": 1.2}), str(tmp_path / "after.parquet"))
    assert tilecast(["compare", after, real, "--before", pred, "--out", str(tmp_path / "rep"), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["before_after"]["makespan_error_before"] == pytest.approx((25 - 29) / 29, rel=1e-9)
    assert abs(s["makespan"]["error"]) < 1e-12
    with open(s["files"]["html"], encoding="utf-8") as f:
        assert "Before and after recalibration" in f.read()


def test_installed_command_prints_exactly_one_json_object(traces, tmp_path):
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-m", "tilecast", "compare", *traces, "--out", str(tmp_path / "rep"),
                        "--json"], capture_output=True, text=True, cwd=root, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tasks"]["matched"] == 15
