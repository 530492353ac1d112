"""tilecast simulate: summary, --json, trace files, --compare-policies, bad input."""

import json
import os

import pytest

from tilecast.cli import main
from tilecast.simulator.simulate import POLICIES
from tilecast.trace import load, step_time

SMALL = ["--model", "gpt2-tiny", "--batch", "2", "--seq", "32", "--tile", "32"]


def test_json_gives_step_time_summary_and_trace_files(tmp_path, capsys):
    out = tmp_path / "t"
    assert main(["simulate", *SMALL, "--machine", "h100-sxm5-80gb-8", "--workers", "4", "--out", str(out),
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["step_s"] == doc["makespan_s"] > 0 and doc["host_s"] == 0  # no host cost measured on this machine
    assert not doc["host_known"] and "unknown" in doc["host_cost"]
    assert doc["step_s"] >= doc["critical_path_s"] and doc["workers"] == 4 and doc["sched"] == "dmda"
    assert len(doc["busy_s"]) == 4 and doc["transfers"] > 0
    assert doc["trace"] == {"table": str(out / "trace.parquet"), "chrome": str(out / "trace.json")}
    trace = load(doc["trace"]["table"])
    assert (trace["task"] >= 0).sum() == doc["tasks"]
    assert (trace["kernel"] == "transfer").sum() == doc["transfers"]
    assert trace["end_s"].max() == pytest.approx(doc["step_s"])
    assert step_time(trace) == doc["step_s"]  # recorded in the file for tilecast compare
    chrome = json.load(open(doc["trace"]["chrome"]))
    assert any(e.get("ph") == "X" for e in chrome["traceEvents"])


def test_human_summary_on_the_local_machine(tmp_path, capsys):
    assert main(["simulate", *SMALL, "--sched", "eager", "--no-trace"]) == 0
    text = capsys.readouterr().out
    assert "(eager, " in text and "critical path" in text
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("predicted step"))
    assert lines[first + 1].split()[0] == "makespan" and lines[first + 2].split()[:2] == ["host", "cost"]


def test_compare_policies_has_one_row_per_policy(capsys):
    assert main(["simulate", *SMALL, "--machine", "a100-sxm4-80gb-8", "--compare-policies", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["sched"] for r in doc["policies"]] == list(POLICIES)
    assert all(r["step_s"] >= r["critical_path_s"] for r in doc["policies"])


@pytest.mark.parametrize("argv, word", [
    (["--machine", "nowhere"], "--machine"),
    (["--workers", "0"], "--workers"),
    (["--machine", "h100-sxm5-80gb-8", "--workers", "9"], "--workers"),
    (["--calibration", "/nonexistent.json"], "--calibration"),
])
def test_bad_input_exits_2_with_one_line(argv, word, capsys):
    assert main(["simulate", *SMALL, "--no-trace", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) >= 1 and word in err[-1]


def test_calibrate_stores_models_that_simulate_then_uses(tmp_path, monkeypatch, capsys):
    import importlib

    host_cost = importlib.import_module("tilecast.loop.host_cost")
    tune = importlib.import_module("tilecast.loop.tune")  # the module (the package exports a function of its name)

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    # the executor's probe steps, made small: one probe, two policies
    monkeypatch.setattr(host_cost, "PROBES", (("gpt2-tiny", 1, 16, "16"),))
    monkeypatch.setattr(host_cost, "SCHED_PROBES", (("gpt2-tiny", 1, 16, "16"),))
    monkeypatch.setattr(tune, "usable_scheds", lambda requested: ["eager", "dmda"])
    assert main(["calibrate", "--model", "gpt2-tiny", "--batch", "1", "--seq", "32", "--tile", "32",
                 "--tiles", "16", "--repeats", "2", "--per-kernel", "4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    workers = sorted(int(w) for w in doc["executor_costs"])
    assert workers[0] == 1 and all(c["task_overhead_us"] >= 0 for c in doc["executor_costs"].values())
    # the runtime's cost between tasks, measured: its constant, or (where that fit at 0) its costs per buffer
    assert all(c["task_overhead_us"] + c["gap_start_buffer_us"] + c["gap_end_buffer_us"] > 0
               for c in doc["executor_costs"].values())
    assert doc["kernels"] >= 10 and doc["timer"] == "starpu-tasks"  # StarPU runs here: shapes timed as its tasks
    assert doc["quiet"]["passes"] >= 3  # each timing pass checked against a reference step
    assert all(r["median_rel_err"] >= 0 for r in doc["heldout"].values())
    assert doc["disk"]["write_bandwidth"] > 0 and os.path.exists(doc["disk"]["file"])  # the disk node, timed
    assert main(["simulate", "--model", "gpt2-tiny", "--batch", "1", "--seq", "32", "--tile", "32",
                 "--no-trace", "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["calibration"] == "stored"
    assert sim["duration_sources"]["measured"] > 0  # the same shapes were timed
    assert sim["host_known"] and sim["step_s"] > sim["makespan_s"]  # the probes' host cost, as tune adds it
    # a second calibration adds its shapes to the store: the first one's stay
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.calibration import find_calibration

    before = sum(len(e["shapes"]) for e in find_calibration(load_machine("local")).points.values())
    assert main(["calibrate", "--model", "gpt2-tiny", "--batch", "1", "--seq", "8", "--tile", "8", "--tiles", "",
                 "--repeats", "2", "--per-kernel", "2", "--no-probe", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["executor_costs"] == {}
    after = sum(len(e["shapes"]) for e in find_calibration(load_machine("local")).points.values())
    assert after == before + again["shapes"]
    assert main(["calibrate", "--model", "gpt2-tiny", "--batch", "1", "--seq", "16", "--tile", "16", "--tiles", "",
                 "--repeats", "2", "--per-kernel", "3", "--timer", "c", "--json",
                 "--output", str(tmp_path / "alone.json")]) == 0
    assert json.loads(capsys.readouterr().out)["timer"] == "c-kernels"


def test_local_simulation_uses_the_cost_per_task_measured_on_starpu(tmp_path, monkeypatch, capsys):
    from tilecast.loop.host_cost import HostCost, save_host_costs
    from tilecast.perfmodel import load_machine

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    args = ["simulate", *SMALL, "--sched", "eager", "--workers", "1", "--no-trace", "--json"]
    assert main(args) == 0
    before = json.loads(capsys.readouterr().out)
    assert before["task_overhead_source"] == "machine description"
    machine = load_machine("local")  # fits are stored for the machine with all its workers, keyed by worker count
    fit = HostCost.fit(1, [[10, 10, 1e-3, 1e-4], [20, 30, 2e-3, 2e-4], [40, 50, 3e-3, 3e-4]],
                       overheads=[[1000.0, 25e-6]])
    save_host_costs(machine, {1: fit})
    assert main(args) == 0
    after = json.loads(capsys.readouterr().out)
    assert after["task_overhead_source"] == "measured on StarPU traces"
    assert after["task_overhead_us"] == pytest.approx(25.0)
    # one worker runs every task, each paying the cost per task: the makespan grows by tasks x the difference
    grown = after["tasks"] * (25e-6 - before["task_overhead_us"] * 1e-6)
    assert after["makespan_s"] - before["makespan_s"] == pytest.approx(grown, rel=1e-6)
    # and the step time is the makespan plus the host cost fitted for one worker, as tune predicts it
    assert not before["host_known"] and before["host_s"] == 0 and before["step_s"] == before["makespan_s"]
    assert after["host_known"] and after["host_s"] == pytest.approx(fit.seconds(after["tiles"], after["tasks"]))
    assert after["step_s"] == pytest.approx(after["makespan_s"] + after["host_s"])
    assert after["step_s"] > after["makespan_s"]
    assert list(after)[:3] == ["step_s", "makespan_s", "host_s"]


def _two_core_machine(tmp_path):
    """A 2-worker CPU machine file and a stored calibration for it whose kernels are far slower than its
    roofline (as the C kernels are than the local machine's detected peak at small tiles)."""
    import yaml

    from sim_machines import KIND, fig
    from tilecast.graph import Tiling
    from tilecast.graph.gpt2 import build_gpt2_step
    from tilecast.graph.model_config import load_model
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.calibration import calibrate, cases_from_shapes
    from tilecast.perfmodel.shapes import graph_shapes

    doc = {"format": 1, "name": "test-two-cores", "runtime": {"task_overhead_us": fig(1.0)},
           "memory_nodes": [{"name": "host", "kind": "ram", "capacity_GiB": fig(64)}],
           "worker_kinds": {"cpu": KIND},
           "workers": [{"name": "cpu", "kind": "cpu", "count": 2, "memory_node": "host"}]}
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(doc))
    machine = load_machine(str(path))
    graph = build_gpt2_step(load_model("gpt2-tiny"), 2, 32, Tiling.parse("32"))
    cases = cases_from_shapes(graph_shapes(graph))
    calibrate(machine, cases, repeats=1, timer=lambda kid, params, bufs, n: [1e-4] * n,
              timer_name="test").save()
    return str(path)


def test_fewer_workers_use_the_same_calibration_and_never_predict_faster(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    machine = _two_core_machine(tmp_path)
    steps = {}
    for w in (1, 2):
        assert main(["simulate", *SMALL, "--machine", machine, "--workers", str(w), "--sched", "eager",
                     "--no-trace", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["calibration"] == "stored" and doc["duration_sources"]["roofline"] == 0
        steps[w] = doc["step_s"]
    assert steps[2] < steps[1]
    # one worker runs every task one after the other: 0.1 ms each plus the machine's 1 us per task
    assert steps[1] == pytest.approx(doc["tasks"] * (1e-4 + 1e-6), rel=1e-6)
