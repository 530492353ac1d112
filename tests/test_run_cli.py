"""tilecast run: timed steps on StarPU, JSON output, trace files, checks and bad input."""

import json

import numpy as np
import pytest

from tilecast.cli import main
from tilecast.trace import load, step_time


def test_run_json_check_and_trace(tmp_path, capsys):
    path = tmp_path / "step.parquet"
    rc = main(["run", "--model", "gpt2-tiny", "--batch", "2", "--seq", "32", "--tile", "32", "--sched", "lws",
               "--workers", "2", "--steps", "3", "--check", "--json", "--trace", str(path)])
    out = capsys.readouterr().out
    assert rc == 0
    res = json.loads(out)  # exactly one JSON object on stdout
    assert out.count("\n") == 1
    assert res["check"]["ok"] and res["check"]["loss"] <= 1e-5
    assert len(res["step_times_s"]) == 3 and res["step_s"] > 0
    assert res["tokens_per_s"] == pytest.approx(2 * 32 / res["step_s"])
    assert res["gflops"] == pytest.approx(res["flops_per_step"] / res["step_s"] / 1e9)
    assert res["losses"][0] == pytest.approx(5.545, abs=0.05)  # ln 256 for a fresh model
    assert 0 < res["makespan_s"] <= res["step_s"] and res["host_s"] == pytest.approx(
        float(np.median(np.subtract(res["step_times_s"][1:], res["makespans_s"][1:]))))
    assert res["blas"]["library"] == "scipy-openblas32" and res["blas"]["core"]
    trace = load(str(path))
    assert len(trace) == res["tasks"] and (trace["source"] == "real").all()
    # the file records the traced (last) step's time, which its tasks' makespan is part of
    assert step_time(trace) == pytest.approx(res["step_times_s"][-1]) and step_time(trace) >= trace["end_s"].max()


def test_run_human_output_and_chrome_trace(tmp_path, capsys):
    path = tmp_path / "step.json"
    rc = main(["run", "--batch", "1", "--seq", "16", "--tile", "16", "--steps", "2", "--trace", str(path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "tokens/s" in out and "GFLOP/s" in out and "median of steps after the first" in out
    assert "BLAS: OpenBLAS" in out and ", core " in out
    events = json.loads(path.read_text())["traceEvents"]
    assert any(e["ph"] == "X" for e in events) and any(e["ph"] == "s" for e in events)


@pytest.mark.parametrize("argv, flag", [
    (["--sched", "fastest"], "--sched"),
    (["--workers", "99"], "--workers"),
    (["--steps", "0"], "--steps"),
    (["--trace", "x.txt"], "--trace"),
    (["--seq", "4096"], "--seq"),  # beyond the model's positions: named by the graph's field, not guessed
])
def test_run_bad_input_is_one_line_exit_2(argv, flag, capsys):
    rc = main(["run", "--batch", "1", "--seq", "8", "--steps", "1"] + argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith(f"tilecast run: {flag}")


def test_first_build_prints_nothing_on_stdout(tmp_path, monkeypatch, capsys):
    """Building an extension (here into a fresh home) must not pollute --json output."""
    from tilecast.kernels import native_build

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    monkeypatch.setattr(native_build, "_LOADED", {})
    mod = native_build.build_extension("_tilecast_probe", "int tc_probe(void);",
                                       "int tc_probe(void) { return 42; }")
    assert mod.lib.tc_probe() == 42
    assert capsys.readouterr().out == ""


def test_run_without_starpu_names_what_to_install(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, TILECAST_STARPU_PKG="starpu-not-installed",
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    p = subprocess.run([sys.executable, "-m", "tilecast", "run", "--steps", "1", "--json"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [
        "tilecast run: StarPU not found (pkg-config starpu-not-installed); to execute graphs, install: "
        "apt-get install libstarpu-dev"]
