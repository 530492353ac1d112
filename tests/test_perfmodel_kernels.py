"""Kernel duration models: calibration on real kernels, held-out error, measured points, storage."""

import json
import sys

import numpy as np
import pytest
from sim_graphs import gemm_chain_graph

from tilecast.kernels import get
from tilecast.perfmodel import load_machine
from tilecast.perfmodel.calibration import (Calibration, CalibrationError, calibrate, cases_from_shapes,
                                            find_calibration, gemm_cases)
from tilecast.perfmodel.kernel_model import DurationModel, FittedKernel, holdout_errors
from tilecast.perfmodel.shapes import graph_shapes
from tilecast.perfmodel.timers import default_timer

# Stated accuracy of the fitted GEMM model on shapes held out of the fit (median relative error).
HELDOUT_MEDIAN_REL_ERR = 0.25


@pytest.fixture(scope="module")
def gemm_calibration():
    """GEMM timed on the C kernels StarPU runs (the numpy references if the C build is unavailable).

    The grid is timed in two passes and each shape keeps its faster median: other processes can only slow
    a kernel down, and a burst of them during one pass would otherwise make the fit's error about the
    machine's load rather than about the model.
    """
    name, timer = default_timer()
    print(f"\ncalibration timer: {name}", file=sys.stderr)
    machine, cases = load_machine("local"), gemm_cases([32, 64, 96, 128, 192, 256])
    passes = [calibrate(machine, cases, repeats=5, timer=timer, timer_name=name) for _ in range(2)]
    first, second = passes[0].points["gemm"], passes[1].points["gemm"]
    assert first["shapes"] == second["shapes"]
    faster = [0 if a <= b else 1 for a, b in zip(first["median_s"], second["median_s"])]
    for key in ("median_s", "mad_s"):
        first[key] = [(first, second)[j][key][i] for i, j in enumerate(faster)]
    return passes[0]


def test_fitted_gemm_model_predicts_held_out_shapes(gemm_calibration):
    report = holdout_errors(gemm_calibration, holdout=0.3, seed=0)
    g = report["gemm"]
    print(f"\ngemm held-out: {g}", file=sys.stderr)
    assert gemm_calibration.timer in ("c-kernels", "numpy-reference")
    assert g["n_heldout"] >= 50
    assert g["median_rel_err"] < HELDOUT_MEDIAN_REL_ERR
    assert 1.0 < g["fit"]["gflops"] < 1e4  # a physical rate, not a degenerate fit


def test_measured_point_wins_over_the_fit(gemm_calibration):
    g = gemm_chain_graph(n_layers=1, tiles=2, tile=64)
    model = DurationModel(load_machine("local"), gemm_calibration)
    d = model.durations(g)
    shapes, t = gemm_calibration.arrays("gemm")
    row = [0, 0, 64, 64, 64, 1.0, 1.0, 64 * 64 * 4, 64 * 64 * 4, 64 * 64 * 4]
    expected = t[[i for i, s in enumerate(shapes.tolist()) if s == row][0]]
    beta1 = g.params[g.param_ptr[:-1] + 6] == 1.0  # tasks with beta 1 match a calibrated shape exactly
    np.testing.assert_allclose(d[0, beta1], expected)
    assert model.provenance["measured"] == int(beta1.sum())
    assert model.provenance["fitted"] == g.n_tasks - int(beta1.sum())


def test_uncalibrated_kinds_use_the_roofline_and_scale_with_work():
    m = load_machine("h100-sxm5-80gb-8")
    small, big = gemm_chain_graph(1, 2, 64), gemm_chain_graph(1, 2, 256)
    ds, db = DurationModel(m).durations(small), DurationModel(m).durations(big)
    assert ds.shape == (1, small.n_tasks)
    assert np.all(db.min() > ds.max())
    assert np.all(ds >= m.kinds["h100"].launch_s)


def test_calibration_is_stored_with_the_fingerprint_and_reused(tmp_path, monkeypatch, gemm_calibration):
    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    m = load_machine("local")
    path = gemm_calibration.save()
    assert m.fingerprint() in path
    again = find_calibration(m)
    assert again is not None and again.points == gemm_calibration.points
    doc = json.load(open(path))
    # timed with other kernel code: not used (the shapes are timed again)
    json.dump({**doc, "kernels": "f" * 16}, open(path, "w"))
    assert find_calibration(m) is None
    doc["fingerprint"] = "0" * 16
    json.dump(doc, open(path, "w"))
    assert find_calibration(m) is None
    with pytest.raises(CalibrationError, match="another machine"):
        Calibration.load(path, m.fingerprint())
    doc["points"]["nope"] = doc["points"]["gemm"]
    json.dump(doc, open(path, "w"))
    with pytest.raises(CalibrationError, match="points.nope"):
        Calibration.load(path)


def test_calibration_cases_come_from_a_graphs_distinct_shapes():
    g = gemm_chain_graph(n_layers=2, tiles=3, tile=48)
    shapes = graph_shapes(g)
    cases = cases_from_shapes(shapes)
    assert len(cases) == 2  # gemm with beta 0 and beta 1: 54 tasks, two shapes
    assert all(name == "gemm" for name, _ in cases)
    timer_calls = []

    def counting_timer(kernel_id, params, buffers, repeats):
        timer_calls.append((kernel_id, [b.nbytes for b in buffers]))
        return np.full(repeats, 1e-5)

    cal = calibrate(load_machine("local"), cases, repeats=3, timer=counting_timer, timer_name="fake")
    assert timer_calls[0] == (get("gemm").id, [48 * 48 * 4] * 3)
    assert cal.points["gemm"]["median_s"] == [1e-5, 1e-5]


def test_fit_recovers_known_coefficients():
    k = get("gemm")
    rows = np.array([[0, 0, m, n, kk, 1, 1, 4 * m * kk, 4 * kk * n, 4 * m * n]
                     for m in (16, 64, 256) for n in (32, 128) for kk in (8, 64, 512)], dtype=float)
    flops = 2 * rows[:, 2] * rows[:, 3] * rows[:, 4]
    nbytes = rows[:, 7] + rows[:, 8] + 2 * rows[:, 9]
    t = 3e-6 + flops / 50e9 + nbytes / 20e9
    fit = FittedKernel.fit(k.id, rows, t)
    np.testing.assert_allclose(fit.predict(rows), t, rtol=1e-6)
    d = fit.describe()
    assert d["fixed_us"] == pytest.approx(3.0, rel=1e-4) and d["gflops"] == pytest.approx(50, rel=1e-4)
