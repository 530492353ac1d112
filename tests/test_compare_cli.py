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
    assert "error -13.79%" in lines[0]
    assert any(line.startswith("gemm") and "-16.67%" in line for line in lines)


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
