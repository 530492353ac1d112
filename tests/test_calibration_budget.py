"""Calibration of a large set of shapes under a time budget: a design is timed, the shape model predicts the rest."""

import sys
import time

import numpy as np
import pytest

from tilecast.graph import Tiling
from tilecast.graph.gpt2 import build_gpt2_step
from tilecast.graph.model_config import load_model
from tilecast.kernels import get
from tilecast.perfmodel.calibration import Calibration, gemm_cases
from tilecast.perfmodel.calibration_design import MIN_GAP, choose_timed, design
from tilecast.perfmodel.shape_model import ShapeModel, holdout_errors, shape_features

from loop_home import loop_home_dir, own_home  # noqa: F401


def _gemm_rows(sizes, trans=((0, 0), (0, 1), (1, 0))):
    return np.array([[ta, tb, m, n, k, 1.0, 1.0, 4 * m * k, 4 * k * n, 4 * m * n]
                     for m in sizes for n in sizes for k in sizes for ta, tb in trans], dtype=np.float64)


def test_design_times_the_ends_then_the_farthest_shapes_within_its_allowance():
    rows = _gemm_rows([16, 32, 64, 128, 256, 512])
    z = shape_features(get("gemm").id, rows)
    cost = np.full(len(rows), 1.0)
    chosen = design(z, cost, allowance_s=12.0)
    assert len(chosen) == 12 == len(set(chosen))  # the allowance pays for 12 shapes of 1 s
    for j in range(2):  # smallest and largest flops and bytes are timed
        assert z[chosen, j].min() == z[:, j].min() and z[chosen, j].max() == z[:, j].max()
    # the farthest-first choice spreads the shapes: no two timed ones closer than the minimum gap
    d = np.linalg.norm(z[chosen][:, None] - z[chosen][None], axis=2)
    assert d[~np.eye(len(chosen), dtype=bool)].min() > MIN_GAP
    # shapes already timed count as covered: a design next to them picks others
    again = design(z, cost, 12.0, known=z[chosen])
    assert len(set(again) - set(chosen)) >= 8


def test_every_shape_is_timed_under_the_budget_and_a_design_over_it():
    cases = [("gemm", r) for r in _gemm_rows([16, 32, 64, 128, 256, 512])]
    cases += [("gelu", np.array([n, 4.0 * n, 4.0 * n])) for n in 2 ** np.arange(6, 20)]
    cost = np.linspace(0.1, 2.0, len(cases))
    timed, left = choose_timed(cases, cost, budget_s=cost.sum() + 1)
    assert timed == list(range(len(cases))) and left == []  # small sets are timed whole
    budget = 0.1 * cost.sum()
    timed, left = choose_timed(cases, cost, budget_s=budget)
    assert sorted(timed + left) == list(range(len(cases))) and len(left) > len(timed) > 0
    assert {cases[i][0] for i in timed} == {"gemm", "gelu"}  # every kernel gets part of the budget
    ends = sum(cost[i] for i in timed[:2])  # the ends of a kernel are timed even past its share
    assert cost[timed].sum() <= budget + ends
    # shapes of equal features (an offset parameter aside) are timed once
    twins = [("attn_qk", np.array([1, 2, 16, 16, 8, 0.35, q0, 0, 1, 1024, 1024, 2048])) for q0 in range(0, 160, 16)]
    timed, left = choose_timed(twins, np.ones(len(twins)), budget_s=1.0)
    assert len(timed) == 1 and len(left) == len(twins) - 1


def test_shape_model_predicts_untimed_shapes_from_their_neighbours():
    """On a cost with a size-dependent rate that the straight physical fit cannot follow, the neighbours'
    correction brings the error on shapes never timed well under the fit's."""
    k = get("gemm")
    rows = _gemm_rows([24, 32, 48, 64, 96, 128, 192, 256, 384])
    flops = 2 * rows[:, 2] * rows[:, 3] * rows[:, 4]
    t = 2e-6 + flops / (60e9 / (1 + (3e5 / flops) ** 0.5)) * (1 + 0.15 * rows[:, 0])  # transposed A is slower
    cases = [("gemm", r) for r in rows]
    timed, left = choose_timed(cases, np.full(len(rows), 1.0), budget_s=40)
    model = ShapeModel.fit(k.id, rows[timed], t[timed])
    err = np.abs(model.predict(rows[left]) - t[left]) / t[left]
    base = np.abs(model.base.predict(rows[left]) - t[left]) / t[left]
    assert np.allclose(model.predict(rows[timed]), t[timed])  # a timed shape is its own measurement
    assert np.median(err) < 0.5 * np.median(base) and np.median(err) < 0.05


def test_holdout_errors_leave_out_inner_shapes_only():
    cal = Calibration("local", "x", "cpu", "fake", kernels="k")
    rows = _gemm_rows([32, 64, 128, 256], trans=((0, 0),))
    for r in rows:
        cal.add("gemm", r, 1e-6 + 2 * r[2] * r[3] * r[4] / 50e9, 0.0)
    rep = holdout_errors(cal)["gemm"]
    assert rep["n_fit"] == len(rows) and 0 < rep["n_heldout"] <= len(rows) - 2  # the smallest and largest stay
    assert rep["median_rel_err"] < 0.01  # an exact linear cost is predicted exactly
    assert rep["fit"]["gflops"] == pytest.approx(50, rel=0.01)


def test_a_budgeted_calibration_times_a_design_and_predicts_the_rest(own_home, capsys):
    """Real C kernels (timed alone, one BLAS thread) on the shapes of a tiny model and a grid of GEMMs,
    under a budget of a fraction of what timing them all is estimated to take: the estimate of what is timed
    stays within the budget, every shape is known afterwards (timed or predicted, none timed again), the
    predicted ones get durations from the shape model, and its held-out error is printed."""
    from tilecast.loop.kernel_calibration import ensure_calibration, estimated_seconds, missing_cases, timing_cost_s
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.kernel_model import DurationModel
    from tilecast.perfmodel.shapes import KernelShapes, graph_shapes

    machine = load_machine("local")
    graphs = [build_gpt2_step(load_model("gpt2-tiny"), 1, 16, Tiling.parse(t)) for t in ("8", "16")]
    rows = np.asarray([r for _, r in gemm_cases([24, 48, 96, 192, 384])])
    gemm = get("gemm")
    sets = [graph_shapes(g) for g in graphs]
    sets.append([KernelShapes(gemm.id, np.arange(len(rows)), rows, np.arange(len(rows)), len(gemm.params))])
    cases = missing_cases(None, sets)
    est = estimated_seconds(machine, cases)
    full_s = float(timing_cost_s(cases, est, np.clip(np.round(0.05 / est), 1, 7) + 1, 1, 1).sum())
    budget = 0.25 * full_s
    start = time.monotonic()
    cal = ensure_calibration(machine, sets, progress=True, in_runtime=False, budget_s=budget)
    wall = time.monotonic() - start
    run = cal.last_run
    print(f"\n{run['timed']} of {run['cases']} shapes timed in {wall:.1f} s (estimated {run['estimated_s']:.2f} s, "
          f"budget {budget:.2f} s, all of them {full_s:.2f} s)", file=sys.stderr)
    assert run["cases"] == len(cases) and 0 < run["timed"] < run["cases"]
    assert run["predicted"] == sum(len(v) for v in cal.predicted.values()) == run["cases"] - run["timed"]
    assert run["estimated_s"] <= budget * 1.25  # a kernel's ends may go past its share, by little
    assert "held out of its fit" in capsys.readouterr().err  # the held-out error is printed
    assert run["heldout"]["gemm"]["n_heldout"] >= 3
    assert all(np.isfinite(r["median_rel_err"]) for r in run["heldout"].values())
    assert missing_cases(cal, sets) == []  # predicted shapes are not timed again
    again = ensure_calibration(machine, sets, progress=False, in_runtime=False, budget_s=budget)
    assert sum(len(e["shapes"]) for e in again.points.values()) == run["timed"]
    model = DurationModel(machine, cal)
    d = model.durations(graphs[0])
    assert np.isfinite(d).all() and (d > 0).all()
    assert model.provenance["fitted"] > 0 and model.provenance["roofline"] == 0


def test_the_accuracy_suite_is_timed_whole():
    """The budget only bites on large sets: the full accuracy suite's shapes fit it, so first use times every
    one of them as before."""
    from tilecast.loop.accuracy_suite import suite_configs
    from tilecast.loop.kernel_calibration import (BUDGET_S, STARPU_PASSES, estimated_seconds, missing_cases,
                                                  starpu_repeats, timing_cost_s)
    from tilecast.perfmodel import load_machine

    machine = load_machine("local")
    graphs = {c.tiling.describe() + c.model.name: c for c in suite_configs("full", workers=[1, 2], policies=["eager"])}
    cases = missing_cases(None, [c.build() for c in graphs.values()])
    est = estimated_seconds(machine, cases)
    cost = timing_cost_s(cases, est, starpu_repeats(est), 2, STARPU_PASSES)
    print(f"\nfull suite: {len(cases)} shapes, estimated {cost.sum():.0f} s to time (budget {BUDGET_S:.0f} s)",
          file=sys.stderr)
    timed, left = choose_timed(cases, cost, BUDGET_S)
    assert left == [] and len(timed) == len(cases)
