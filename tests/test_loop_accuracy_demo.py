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


def test_full_suite_covers_two_shapes_three_tilings_two_schedulers():
    configs = suite_configs("full", workers=2)
    assert len(configs) >= 12
    shapes = {c.model.name for c in configs}
    assert len(shapes) >= 2
    for s in shapes:
        mine = [c for c in configs if c.model.name == s]
        assert len({c.tiling.describe() for c in mine}) >= 3 and len({c.sched for c in mine}) >= 2
    assert len({c.label() for c in configs}) == len(configs)


def test_learning_pass_is_needed_until_the_models_learned_the_suites_shapes_from_runs():
    from tilecast.loop.accuracy import LEARNED_SHARE, needs_learning_pass
    from tilecast.loop.kernel_calibration import missing_cases
    from tilecast.perfmodel.calibration import TRACE, Calibration

    graphs = {c.graph_key: c.build() for c in suite_configs("quick", workers=2)}.values()
    cases = missing_cases(None, graphs)
    cal = Calibration("m", "f", "cpu", "c-kernels")
    for name, row in cases:
        cal.add(name, row, 1e-5, 0.0)  # timed alone
    assert needs_learning_pass(None, graphs) and needs_learning_pass(cal, graphs)
    learned = int(np.ceil(LEARNED_SHARE * len(cases)))
    for name, row in cases[:learned - 1]:
        cal.add(name, row, 2e-5, 0.0, TRACE)
    assert needs_learning_pass(cal, graphs)  # one short of the share
    cal.add(*cases[learned - 1], 2e-5, 0.0, TRACE)
    assert not needs_learning_pass(cal, graphs)


@needs_starpu
def test_accuracy_quick_suite_json(loop_home, capsys):  # noqa: F811
    status = main(["accuracy", "--suite", "quick", "--steps", "2", "--warmup", "1", "--learning-pass", "always",
                   "--json"])
    doc = json.loads(capsys.readouterr().out)
    first = doc["learning_pass"]  # the suite run once with recalibration, then predicted again and measured
    assert len(first["rows"]) == len(doc["rows"]) and first["calibration_files"]
    for a, b in zip(first["rows"], doc["rows"]):  # the measured pass predicts with the models stored by the first
        assert (a["sched"], a["tiling"]) == (b["sched"], b["tiling"])
        assert b["pred_step_s"] == pytest.approx(a["pred_step_s_recalibrated"], rel=1e-9)
    from tilecast.loop.accuracy import needs_learning_pass
    from tilecast.loop.kernel_calibration import ensure_calibration
    from tilecast.perfmodel import load_machine

    from tilecast.loop.kernel_calibration import untraced_cases

    graphs = {c.graph_key: c.build() for c in suite_configs("quick")}.values()
    cal = ensure_calibration(load_machine("local"), graphs, progress=False)
    assert not needs_learning_pass(cal, graphs)
    # AdamW's shapes too, though its step number differed in every traced step
    assert [name for name, _ in untraced_cases(cal, graphs) if name == "adamw"] == []
    assert len(doc["rows"]) == len(suite_configs("quick"))
    want = ranking_accuracy([r["pred_step_s"] for r in doc["rows"]], [r["real_step_s"] for r in doc["rows"]])
    for k in ("median_abs_error", "max_abs_error", "kendall_tau", "best_gap"):
        assert doc[k] == pytest.approx(want[k])
    assert doc["targets"] == TARGETS
    assert status == (0 if all(doc["targets_met"].values()) else 1)
    assert doc["conditions"]["load_average_before"] >= 0
    q = doc["conditions"]["quiet"]  # every session ran between two reference steps
    sessions = sum(len(r["real_rounds_s"]) for r in doc["rows"])
    assert q["reference_probes"] >= 2 * sessions and q["reference_best_s"] > 0 and q["waited_s"] <= 5.0 + 1e-6
    for r in doc["rows"]:
        assert 0 <= r["sessions_disturbed"] <= len(r["real_rounds_s"]) and r["reference_ratio_max"] >= 1.0


def test_accuracy_bad_input(capsys):
    assert main(["accuracy", "--steps", "0"]) == 2
    assert main(["accuracy", "--max-wait", "-1"]) == 2
    assert "--steps" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["accuracy", "--learning-pass", "sometimes"])
    assert e.value.code == 2 and "--learning-pass" in capsys.readouterr().err
    if starpu_policies() is not None:  # more workers than StarPU runs: told before anything is measured
        assert main(["accuracy", "--workers", "100000"]) == 2
        assert "--workers must be at most" in capsys.readouterr().err


@needs_starpu
def test_demo_writes_the_report(loop_home, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "demo"
    assert main(["demo", "--model", "gpt2-tiny", "--batch", "2", "--seq", "32", "--top", "1", "--steps", "1",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert str(out / "report.html") in text
    assert "step time predicted" in text.splitlines()[1] and "makespan" in text
    summary = json.load(open(out / "summary.json"))
    assert list(summary)[0] == "step" and summary["step"]["error"] is not None
    for name in ("report.html", "gantt.png", "kernel_errors.png", "summary.json", "ranking.csv", "executed.json"):
        assert os.path.getsize(out / name) > 0, name
    executed = json.load(open(out / "executed.json"))
    assert len(executed) == 2 and executed[0]["rank"] == 1 and executed[1]["rank"] > 1
    assert list((out / "configs").glob("*/report.html"))
