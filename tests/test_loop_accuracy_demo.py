"""tilecast accuracy and tilecast demo, on their cheapest settings."""

import json
import os

import numpy as np
import pytest

from tilecast.cli import main
from tilecast.loop.accuracy import TARGETS, suite_configs
from tilecast.loop.tune import starpu_policies
from tilecast.reports import ranking_accuracy

from loop_home import loop_home, loop_home_dir  # noqa: F401

needs_starpu = pytest.mark.skipif(starpu_policies() is None, reason="StarPU or the C kernels are not available here")


def test_full_suite_has_three_shapes_of_four_tilings_a_llama_every_policy_and_both_worker_counts():
    from tilecast.loop.accuracy_suite import suite_policies
    from tilecast.loop.interference import REFERENCE

    configs = suite_configs("full", workers=[1, 2], policies=suite_policies())
    assert len(configs) >= 48 and len({c.label() for c in configs}) == len(configs)
    shapes = {c.model.name for c in configs}
    assert REFERENCE[0] not in shapes  # the quiet check's reference is not in the suite
    tilings = {s: len({c.tiling.describe() for c in configs if c.model.name == s}) for s in shapes}
    assert sum(n >= 4 for n in tilings.values()) >= 3 and min(tilings.values()) >= 2
    assert any(c.model.family == "llama" for c in configs)
    for s in shapes:
        mine = [c for c in configs if c.model.name == s]
        for key in {c.graph_key for c in mine}:  # every task graph runs with one worker and with two
            assert {c.workers for c in mine if c.graph_key == key} == {1, 2}
    assert {c.sched for c in configs} == set(suite_policies())
    graphs = {c.graph_key: (c, c.build()) for c in configs}
    # one shape with an odd head count and uneven tiles, one with at least 5,000 tasks, one of big GEMMs
    odd = [c for c, _ in graphs.values() if c.model.n_head % 2 == 1]
    assert odd and all(c.seq % c.tiling.tile("seq", c.seq) or c.model.n_embd % c.tiling.tile("embd", c.model.n_embd)
                       for c in odd)
    assert max(g.n_tasks for _, g in graphs.values()) >= 5000
    assert max(c.model.n_embd for c, _ in graphs.values()) >= 512


def test_suite_workers_are_checked_before_anything_runs():
    with pytest.raises(ValueError, match="workers must be positive"):
        suite_configs("quick", workers=[0])
    with pytest.raises(ValueError, match="suite must be one of"):
        suite_configs("nope")


def test_a_tau_a_rounding_under_its_target_meets_it():
    # a shape's tau of 0.85 as an accuracy run computed it, a hair under in floating point
    from tilecast.loop.accuracy import check_targets

    base = {"median_abs_error": 0.04, "max_abs_error": 0.09, "best_gap": 0.01}
    assert 0.8499999999999999 < 0.85 and check_targets({**base, "kendall_tau": 0.8499999999999999})["kendall_tau"]
    assert not check_targets({**base, "kendall_tau": 0.849})["kendall_tau"]
    assert not check_targets({**base, "kendall_tau": None})["kendall_tau"]
    assert all(check_targets({**base, "kendall_tau": 0.9}).values())


def test_figures_rank_within_each_model_shape():
    from tilecast.loop.accuracy import figures_of

    rows = [{"model": "a", "real_step_s": 1.0, "pred_first_use_s": 1.1},
            {"model": "a", "real_step_s": 2.0, "pred_first_use_s": 1.9},
            {"model": "b", "real_step_s": 10.0, "pred_first_use_s": 12.0},
            {"model": "b", "real_step_s": 11.0, "pred_first_use_s": 11.0}]
    f = figures_of(rows, "first_use")
    assert f["median_abs_error"] == pytest.approx(0.075) and f["max_abs_error"] == pytest.approx(0.2)
    # shape a is ordered right, shape b reversed: the lowest tau and the largest gap are reported
    assert f["per_shape"]["a"]["kendall_tau"] == pytest.approx(1.0)
    assert f["kendall_tau"] == pytest.approx(-1.0) and f["best_gap"] == pytest.approx(0.1)
    assert f["per_shape"]["b"]["predicted_best"] == 3 and f["per_shape"]["b"]["measured_best"] == 2


def test_first_use_models_leave_out_what_runs_taught():
    from tilecast.loop.host_cost import HostCost, calibrated_only, fit_key, learn_from_runs, probe_key
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.calibration import PROBE_TRACE, STARPU_TASKS, TRACE, Calibration
    from tilecast.perfmodel.from_trace import calibration_from_trace
    from tilecast.trace import make_trace

    graph = suite_configs("quick", workers=[1])[0].build()
    machine = load_machine("local")
    cal = Calibration(machine.name, machine.fingerprint(), machine.kind_names[0], STARPU_TASKS)
    from tilecast.loop.kernel_calibration import missing_cases

    for name, row in missing_cases(None, [graph]):
        cal.add(name, row, 1e-5, 0.0, STARPU_TASKS)
    n = graph.n_tasks
    trace = make_trace(task=np.arange(n), kernel=["k"] * n, worker=np.zeros(n, int), node=np.zeros(n, int),
                       start_s=np.arange(n) * 1e-4, end_s=np.arange(n) * 1e-4 + 5e-5, bytes=0, flops=0.0,
                       source="real", tag="")
    probe = calibration_from_trace(graph, trace, machine, base=cal, source=PROBE_TRACE)
    learned = calibration_from_trace(graph, trace, machine, base=probe)
    name = next(iter(cal.points))
    # the probes' trace replaces the shapes timed as tasks (both calibration); a run's trace comes first but
    # the calibration's points stay beside it
    assert set(probe.sources(name)) == {PROBE_TRACE}
    assert set(learned.sources(name)) == {TRACE, PROBE_TRACE} and np.allclose(learned.arrays(name)[1], 5e-5)
    learned.points[name]["median_s"] = [7e-5 if src == TRACE else m for m, src in
                                        zip(learned.points[name]["median_s"], learned.sources(name))]
    assert np.allclose(learned.arrays(name)[1], 7e-5)
    view = learned.calibrated_only()
    assert set(view.sources(name)) == {PROBE_TRACE} and np.allclose(view.arrays(name)[1], 5e-5)
    assert set(cal.calibrated_only().sources(name)) == {STARPU_TASKS}
    assert np.allclose(cal.calibrated_only().arrays(name)[1], 1e-5)

    pts = [[100, 1000, 0.01, 0.001]] * 3
    fits = {2: HostCost.fit(2, pts), probe_key(2, "dmda"): HostCost.fit(2, pts)}
    fits[fit_key(2, "dmda")] = fits[probe_key(2, "dmda")]
    runs = [(2, "dmda", 200, 5000, 0.1, 0.2, 1e-5)] * 5  # runs with ten times the probes' host cost
    taught = learn_from_runs(fits, runs)
    assert taught[fit_key(2, "dmda")].seconds(200, 5000) > 5 * fits[2].seconds(200, 5000)
    view = calibrated_only(taught)
    assert view[fit_key(2, "dmda")] is fits[probe_key(2, "dmda")] and view[2] is fits[2]


@needs_starpu
def test_accuracy_quick_suite_json(loop_home, capsys):  # noqa: F811
    status = main(["accuracy", "--suite", "quick", "--steps", "1", "--warmup", "1", "--json"])
    doc = json.loads(capsys.readouterr().out)
    rows = doc["rows"]
    assert len(rows) == len(suite_configs("quick"))
    for v in ("first_use", "held_out", "repeatability"):
        want = ranking_accuracy([r[f"pred_{v}_s"] for r in rows], [r["real_step_s"] for r in rows])
        assert doc["views"][v]["median_abs_error"] == pytest.approx(want["median_abs_error"])
        assert doc["views"][v]["max_abs_error"] == pytest.approx(want["max_abs_error"])
    for k in ("median_abs_error", "max_abs_error", "kendall_tau", "best_gap"):  # the headline is first use
        assert doc[k] == doc["views"]["first_use"][k]
    assert doc["targets"] == TARGETS
    assert status == (0 if all(doc["targets_met"].values()) else 1)
    # first use predicts from the calibration alone: the same as predicting in a home where nothing ran
    from tilecast.loop.host_cost import calibrated_only, load_host_costs
    from tilecast.loop.predict import predict
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.calibration import find_calibration

    machine = load_machine("local")
    cal, host = find_calibration(machine).calibrated_only(), calibrated_only(load_host_costs(machine))
    for c, r in zip(suite_configs("quick"), rows):
        assert predict(c, machine, cal, host).step_s == pytest.approx(r["pred_first_use_s"], rel=1e-9)
    assert doc["conditions"]["load_average_before"] >= 0 and doc["conditions"]["blas"]["core"]
    q = doc["conditions"]["quiet"]  # every session ran between reference steps (shared by consecutive ones)
    sessions = sum(len(r["real_rounds_s"]) for r in rows)
    # the first session's probe before may be calibration's last, still fresh (QuietGuard.reuse_s): not counted here
    assert q["reference_probes"] >= sessions and q["reference_best_s"] > 0 and q["waited_s"] <= 5.0 + 1e-6
    for r in rows:
        assert 0 <= r["sessions_disturbed"] <= len(r["real_rounds_s"]) and r["reference_ratio_max"] >= 1.0
        # each session: its median step and the probes around it, as the counts above add them up
        assert [s["median_s"] for s in r["sessions"]] == pytest.approx(r["real_round_medians_s"])
        assert sum(s["disturbed"] for s in r["sessions"]) == r["sessions_disturbed"]
        assert max(max(s["probe_before"], s["probe_after"]) for s in r["sessions"]) == r["reference_ratio_max"]


def test_accuracy_bad_input(capsys):
    assert main(["accuracy", "--steps", "0"]) == 2
    assert main(["accuracy", "--max-wait", "-1"]) == 2
    assert "--steps" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["accuracy", "--suite", "sometimes"])
    assert e.value.code == 2 and "--suite" in capsys.readouterr().err
    assert main(["accuracy", "--worker-counts", "0"]) == 2
    assert "--worker-counts must be positive" in capsys.readouterr().err
    if starpu_policies() is not None:  # more workers than StarPU runs: told before anything is measured
        assert main(["accuracy", "--worker-counts", "1,100000"]) == 2
        assert "must be at most" in capsys.readouterr().err
        assert main(["accuracy", "--scheds", "eager,fifo9"]) == 2
        assert "fifo9" in capsys.readouterr().err


@needs_starpu
def test_demo_writes_the_report(loop_home, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "demo"
    assert main(["demo", "--model", "gpt2-tiny", "--batch", "2", "--seq", "32", "--execute", "1", "--steps", "1",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert str(out / "report.html") in text
    assert "step time predicted" in text.splitlines()[1] and "makespan" in text
    assert text.splitlines()[2].startswith("BLAS: ")  # which OpenBLAS core timed the runs
    summary = json.load(open(out / "summary.json"))
    assert list(summary)[0] == "step" and summary["step"]["error"] is not None
    for name in ("report.html", "gantt.png", "kernel_errors.png", "summary.json", "ranking.csv", "executed.json"):
        assert os.path.getsize(out / name) > 0, name
    executed = json.load(open(out / "executed.json"))
    assert len(executed) == 2 and executed[0]["rank"] == 1 and executed[1]["rank"] > 1
    assert list((out / "configs").glob("*/report.html"))
