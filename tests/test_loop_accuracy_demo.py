"""tilecast accuracy and tilecast demo, on their cheapest settings."""

import json
import os

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


@needs_starpu
def test_accuracy_quick_suite_json(loop_home, capsys):  # noqa: F811
    status = main(["accuracy", "--suite", "quick", "--steps", "2", "--warmup", "1", "--json"])
    doc = json.loads(capsys.readouterr().out)
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


@needs_starpu
def test_demo_writes_the_report(loop_home, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "demo"
    assert main(["demo", "--model", "gpt2-tiny", "--batch", "2", "--seq", "32", "--top", "1", "--steps", "1",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert str(out / "report.html") in text
    for name in ("report.html", "gantt.png", "kernel_errors.png", "summary.json", "ranking.csv", "executed.json"):
        assert os.path.getsize(out / name) > 0, name
    executed = json.load(open(out / "executed.json"))
    assert len(executed) == 2 and executed[0]["rank"] == 1 and executed[1]["rank"] > 1
    assert list((out / "configs").glob("*/report.html"))
