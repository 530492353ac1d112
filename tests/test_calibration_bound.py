"""Shapes too long or too large to time (a cluster-size model's tiles) are never timed: the shape model
extrapolates them from the largest timed shapes, and the error of that extrapolation is measured."""

import os
import sys

import numpy as np
import pytest

from tilecast.kernels import get
from tilecast.perfmodel.calibration import Calibration, gemm_cases
from tilecast.perfmodel.calibration_design import TOP_TIMED, choose_timed, largest, over_bound
from tilecast.perfmodel.shape_model import ShapeModel, beyond_decades, extrapolation_errors, shape_features

from loop_home import loop_home, loop_home_dir, own_home  # noqa: F401


def _gemm(m, n, k):
    return np.array([0, 0, m, n, k, 1.0, 1.0, 4 * m * k, 4 * k * n, 4 * m * n], dtype=np.float64)


def _truth(rows):
    """A GEMM cost with a rate that saturates with size (as a BLAS does) and a fixed cost per call."""
    flops = 2 * rows[:, 2] * rows[:, 3] * rows[:, 4]
    return 3e-6 + flops / (80e9 * flops / (flops + 2e6))


def test_over_bound_flags_long_tasks_and_large_buffers():
    flags = over_bound([0.1, 0.6, 0.1], [1e6, 1e6, 3e9], available_bytes=16e9, max_task_s=0.5, share=0.125)
    assert flags.tolist() == [False, True, True]  # 3 GB over 1/8 of 16 GB, 0.6 s over 0.5 s


def test_a_shape_over_the_bound_is_never_timed_and_the_largest_affordable_are():
    sizes = [32, 64, 128, 256, 512]
    cases = gemm_cases(sizes) + [("gemm", _gemm(4096, 4096, 4096)), ("gemm", _gemm(8192, 4096, 8192))]
    rows = np.asarray([r for _, r in cases])
    est = 2 * rows[:, 2] * rows[:, 3] * rows[:, 4] / 50e9  # seconds of one task at 50 GFLOP/s
    over = over_bound(est, rows[:, 7:].sum(axis=1), 16e9)
    assert over.tolist() == [False] * (len(cases) - 2) + [True, True]
    timed, left = choose_timed(cases, np.ones(len(cases)), None, over=over)  # no budget: every other shape
    assert sorted(timed) == list(range(len(cases) - 2)) and left == [len(cases) - 2, len(cases) - 1]
    timed, left = choose_timed(cases, np.ones(len(cases)), budget_s=12.0, over=over)  # a design of 12 or so
    assert not set(timed) & {len(cases) - 2, len(cases) - 1} and 0 < len(timed) < len(cases) - 2
    z = np.unique(shape_features(get("gemm").id, rows[:-2]), axis=0)  # shapes of equal features timed once
    got = {tuple(r) for r in shape_features(get("gemm").id, rows[timed])}
    assert {tuple(z[i]) for i in largest(z, TOP_TIMED)} <= got  # the base of the extrapolation is timed
    assert len(timed) + len(left) == len(cases)


def test_extrapolation_of_a_known_cost_from_the_largest_timed_shapes():
    """Timed GEMMs up to 512^3 and a cost known exactly: shapes 8-64x larger in flops are predicted within
    2% (the rate has saturated), and extrapolation_errors measures the same on the largest timed shapes."""
    k = get("gemm")
    rows = np.asarray([r for _, r in gemm_cases([32, 64, 128, 256, 512])])
    cal = Calibration("local", "x", "cpu", "fake", kernels="k")
    for r, t in zip(rows, _truth(rows)):
        cal.add("gemm", r, float(t), 0.0)
    far = np.asarray([_gemm(1024, 1024, 1024), _gemm(2048, 1024, 2048), _gemm(512, 4096, 4096)])
    model = ShapeModel.fit(k.id, rows, _truth(rows))
    assert (model.beyond(far) > 0.8).all() and (model.beyond(rows) == 0).all()
    err = np.abs(model.predict(far) - _truth(far)) / _truth(far)
    assert err.max() < 0.02
    rep = extrapolation_errors(cal)["gemm"]
    assert rep["n_heldout"] >= 2 and rep["decades"] > 0  # the largest were predicted from smaller shapes alone
    assert rep["max_rel_err"] < 0.05
    assert beyond_decades(shape_features(k.id, rows), shape_features(k.id, far)).min() > 0.8


def test_extrapolation_of_real_gemm_timings(own_home):
    """Real C kernel GEMMs timed alone on one BLAS thread, 48 to 384; the largest ones held out and predicted
    from the smaller: the error is printed and stays within 30% (GEMM's rate flattens past 256 on this
    machine; the tolerance covers the load of a shared machine)."""
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.calibration import calibrate
    from tilecast.perfmodel.timers import c_kernel_timer

    timer = c_kernel_timer()
    if timer is None:
        pytest.skip("the C kernels could not be built here")
    cases = gemm_cases([48, 96, 192, 384])
    cal = calibrate(load_machine("local"), cases, repeats=5, timer=timer, timer_name="c-kernels")
    rep = extrapolation_errors(cal)["gemm"]
    print(f"\nreal GEMMs 48-384, the largest {rep['n_heldout']} predicted from the smaller ones "
          f"({rep['decades']:.2f} decades beyond): median error {100 * rep['median_rel_err']:.1f}%, "
          f"max {100 * rep['max_rel_err']:.1f}% (load {os.getloadavg()[0]:.1f})", file=sys.stderr)
    assert rep["n_heldout"] >= 2 and rep["decades"] > 0.2
    assert rep["median_rel_err"] < 0.3


def test_first_use_leaves_huge_shapes_to_the_shape_model(own_home, capsys):
    """ensure_calibration on a small model's shapes and GEMMs of 4096^3 and beyond (over a second each at
    this machine's peak): those are recorded as predicted, never timed; the note says so with the measured
    extrapolation error; the duration model labels them extrapolated."""
    from tilecast.graph import Tiling
    from tilecast.graph.gpt2 import build_gpt2_step
    from tilecast.graph.model_config import load_model
    from tilecast.graph.models import build_step
    from tilecast.loop.kernel_calibration import ensure_calibration, missing_cases
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.kernel_model import DurationModel
    from tilecast.perfmodel.shapes import KernelShapes, graph_shapes

    machine = load_machine("local")
    gemm = get("gemm")
    rows = np.asarray([r for _, r in gemm_cases([32, 64, 128, 256])] + [_gemm(4096, 4096, 4096),
                                                                       _gemm(8192, 8192, 4096)])
    sets = [graph_shapes(build_gpt2_step(load_model("gpt2-tiny"), 1, 16, Tiling.parse("16")))]
    sets.append([KernelShapes(gemm.id, np.arange(len(rows)), rows, np.arange(len(rows)), len(gemm.params))])
    cal = ensure_calibration(machine, sets, progress=True, in_runtime=False, budget_s=None)
    run = cal.last_run
    timed = {tuple(s) for s in cal.points["gemm"]["shapes"]}
    assert all(tuple(r) not in timed for r in rows[-2:])  # the huge GEMMs were not timed
    assert all(tuple(r) in timed for r in rows[:-2])
    assert run["over_bound"] == 2 and run["extrapolated"]["gemm"]["n"] == 2
    assert run["extrapolated"]["gemm"]["decades"] > 1 and run["extrapolated"]["gemm"]["heldout"]["n_heldout"] >= 1
    err = capsys.readouterr().err
    assert "over the timing bound" in err and "extrapolated" in err
    assert missing_cases(cal, sets) == []  # not timed again next time
    big = build_step(load_model("gpt2-tiny"), 1, 16, Tiling.parse("16"))
    model = DurationModel(machine, cal)
    model.durations(big)
    p = model.provenance
    assert p["fitted"] == p["interpolated"] + p["extrapolated"] and p["roofline"] == 0
    sec, how = model.shape_seconds(machine.kind_names[0], gemm.id, rows)
    assert (how[-2:] == 3).all() and (how[:-2] == 0).all()  # extrapolated; the others measured
    assert (sec[-2:] > sec[:-2].max()).all()


# A model whose only large tensors are the vocabulary's (2 M tokens x 128, untiled: its logits GEMM 131 GFLOP,
# its embedding 1 GB a buffer), so that everything else is quick to time; llama2-7b, the cluster-size case itself,
# takes minutes of calibration here and runs with the benchmarks (-m benchmark).
HUGE_VOCAB = '{"n_layer":1,"n_embd":128,"n_head":2,"vocab_size":2000000,"n_positions":256}'


@pytest.mark.parametrize("model, tile", [(HUGE_VOCAB, "2000000"),
                                         pytest.param("llama2-7b", "32768", marks=pytest.mark.benchmark)])
def test_tune_times_no_shape_over_the_bound(model, tile, loop_home, capsys):  # noqa: F811
    """tilecast tune on a step with tensors of gigabytes at a tiny batch (1 x 256, untiled; llama2-7b's
    vocabulary GEMMs are 67 GFLOP and its AdamW over the embedding takes 2 GB a lane): it returns, the
    calibration store holds none of the shapes over the bound among its timed ones (all are recorded as
    predicted), and the note about them is one line of standard error."""
    import json

    from tilecast.cli import main
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model
    from tilecast.graph.models import build_step
    from tilecast.loop.kernel_calibration import bounded_cases, missing_cases
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.calibration import find_calibration

    argv = ["tune", "--model", model, "--batch", "1", "--seq", "256", "--scheds", "eager", "--workers", "1",
            "--tiles", tile, "--json"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["ranking"]
    notes = [line for line in err.splitlines() if "over the timing bound" in line]
    assert len(notes) == 1 and "extrapolated" in notes[0]
    print("\n" + notes[0], file=sys.stderr)
    machine = load_machine("local")
    cal = find_calibration(machine)
    graphs = [build_step(load_model(model), 1, 256, Tiling.parse(tile))]
    cases = missing_cases(None, graphs)
    over, _ = bounded_cases(machine, None, cases, 2)
    huge = [(name, tuple(float(x) for x in row)) for (name, row), o in zip(cases, over) if o]
    assert any(name == "gemm" for name, _ in huge)  # the vocabulary GEMMs: over 0.5 s at this machine's peak
    timed = {(name, tuple(s)) for name, e in cal.points.items() for s in e["shapes"]}
    predicted = {(name, tuple(s)) for name, rows in cal.predicted.items() for s in rows}
    assert not set(huge) & timed and set(huge) <= predicted
