"""calibrate --check: the reference step now against the one the stored calibration was timed beside."""

import json
from types import SimpleNamespace

import pytest

from tests.loop_home import loop_home_dir, own_home  # noqa: F401
from tilecast.errors import FieldError
from tilecast.loop.speed_check import THRESHOLD, calibrated_reference, check_speed


def _cal(reference_s):
    return SimpleNamespace(quiet={"reference_s": reference_s} if reference_s else {})


@pytest.mark.parametrize("now_ms, within, words", [
    (39.2, True, "runs 2% faster than when calibrated (within 12%)"),
    (40.0, True, "runs as fast as when calibrated"),
    (46.0, False, "runs 15% slower than when calibrated; steps may take about 1.15x their forecasts"),
    (34.0, False, "runs 15% faster than when calibrated; steps may take about 0.85x their forecasts"),
])
def test_the_verdict_follows_the_median_of_the_probes(now_ms, within, words):
    taken = iter([now_ms * 1e-3, 0.5, now_ms * 1e-3, 0.001, now_ms * 1e-3])  # two outliers the median ignores
    c = check_speed(_cal(0.040), workers=2, probe=lambda: next(taken))
    assert c.now_s == pytest.approx(now_ms * 1e-3)
    assert c.ratio == pytest.approx(now_ms / 40.0)
    assert c.within is within
    assert words in c.line()
    d = c.to_dict()
    assert d["within"] is within and len(d["reference_probes_s"]) == 5 and d["threshold"] == THRESHOLD


def test_a_calibration_without_a_reference_step_is_refused_before_anything_runs():
    ran = []
    for cal in (None, _cal(None)):
        with pytest.raises(FieldError, match="^calibration: .*run tilecast calibrate first"):
            check_speed(cal, workers=1, probe=lambda: ran.append(1) or 0.04)
    assert not ran
    assert calibrated_reference(_cal(0.03)) == 0.03
    with pytest.raises(FieldError, match="^probes"):
        check_speed(_cal(0.03), workers=1, probes=0, probe=lambda: 0.04)


def test_check_flags_that_store_nothing_are_refused(capsys):
    from tilecast.cli import main

    assert main(["calibrate", "--check", "--output", "x.json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--check: times nothing to store, so it takes no --output" in err


def test_check_on_starpu_against_a_stored_calibration(own_home, capsys):  # noqa: F811
    """A real calibration (StarPU tasks beside the reference step), then --check times the reference on StarPU."""
    import tilecast as tc
    from tilecast.cli import main
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.calibration import find_calibration

    assert main(["calibrate", "--check"]) == 2  # nothing stored yet: one line, nothing run
    assert "run tilecast calibrate first" in capsys.readouterr().err
    from tilecast.loop.kernel_calibration import starpu_workers

    if not starpu_workers(load_machine("local")):
        pytest.skip("StarPU does not run here: no reference step to time")
    tc.calibrate("gpt2-tiny", batch=2, seq=32, tile="32", tiles=("32",), repeats=2, per_kernel=2, probe=False)
    stored = find_calibration(load_machine("local")).quiet["reference_s"]
    status = main(["calibrate", "--check", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["reference_calibrated_s"] == pytest.approx(stored)
    probes = out["reference_probes_s"]
    assert len(probes) == 5 and all(0.001 < p < 10.0 for p in probes)
    assert out["ratio"] == pytest.approx(out["reference_now_s"] / stored)
    assert out["within"] == (abs(out["ratio"] - 1) <= out["threshold"])
    assert status == (0 if out["within"] else 1)
    res = tc.check_speed(probes=2)  # the library call the command makes, one result per call
    assert res.reference_calibrated_s == pytest.approx(stored) and len(res.to_frame()) == 2
    assert res.line.startswith("reference step now ") and res.within == (abs(res.ratio - 1) <= res.threshold)
    with pytest.raises(FieldError, match="^threshold"):
        tc.check_speed(threshold=0)
