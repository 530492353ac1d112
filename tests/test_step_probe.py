"""The in-step factors: a traced probe step's tasks against their own lane figures, and the lanes' hot figure
and cache part scaled by them in forecasts."""

import dataclasses
import json

import numpy as np
import pytest
from test_shared_cache import _calibration

from tilecast.loop.step_probe import (FACTOR_RANGE, HOT_RANGE, PROBE_MODEL, fit_factors, fit_in_step_factors,
                                     probe_config, probe_graph)
from tilecast.perfmodel import load_machine
from tilecast.perfmodel.calibration import Calibration, CalibrationError
from tilecast.perfmodel.kernel_model import DurationModel


@pytest.fixture(scope="module")
def probe():
    machine = load_machine("local")
    g = probe_graph()
    return machine, g, _calibration(g, machine)


def _lane_durations(machine, graph, cal, factor=1.0, hot=1.0):
    c = dataclasses.replace(cal, in_step_factor=factor, in_step_hot=hot)
    return DurationModel(machine.with_workers(1), c).durations(graph)[0]


def _hot(machine, graph, cal):
    from tilecast.perfmodel.task_lanes import lanes_of

    d = DurationModel(machine.with_workers(1), dataclasses.replace(cal, in_step_factor=1.0)).durations(graph)
    return lanes_of(d).hot[0]


def test_the_probe_is_no_shape_used_elsewhere():
    from tilecast.loop.accuracy_suite import SUITES
    from tilecast.loop.host_cost import PROBES

    names = {s.model["name"] for shapes, _ in SUITES.values() for s in shapes} | {p[0] for p in PROBES}
    assert PROBE_MODEL["name"] not in names
    c = probe_config()
    assert (c.workers, c.sched) == (1, "eager") and probe_graph().n_tasks > 500


def test_the_factors_are_those_the_traced_tasks_were_made_with(probe):
    machine, g, cal = probe
    lanes, hot = _lane_durations(machine, g, cal), _hot(machine, g, cal)
    assert lanes.sum() > hot.sum()  # the probe's tasks have a cache part to scale
    for r, a in ((1.0, 1.25), (1.16, 1.05), (0.9, 0.0), (1.1, 1.1), (1.0, 1.0)):
        traced = r * hot + a * (lanes - hot)
        factors, sums = fit_in_step_factors(g, traced, machine, cal)
        assert factors == pytest.approx((r, a), abs=1e-6) and sums["tasks"] == g.n_tasks
        assert sums["whole_ratio"] == pytest.approx(traced.sum() / lanes.sum())
    traced = 1.2 * hot + 1.1 * (lanes - hot)
    traced[::3] = np.nan  # tasks missing from the trace are left out of every sum
    factors, sums = fit_in_step_factors(g, traced, machine, cal)
    assert sums["tasks"] == g.n_tasks - len(range(0, g.n_tasks, 3)) and factors == pytest.approx((1.2, 1.1))


def test_the_fit_matches_the_probes_sum_and_keeps_its_ranges():
    rng = np.random.default_rng(1)
    hot = rng.uniform(1e-6, 1e-4, 400)
    part = hot * rng.uniform(0.0, 0.6, 400)
    traced = (1.15 * hot + 1.05 * part) * rng.lognormal(0.0, 0.1, 400)  # noisy tasks: the sum is still matched
    r, a = fit_factors(traced, hot, part)
    assert r * hot.sum() + a * part.sum() == pytest.approx(traced.sum())
    assert 1.05 < r < 1.25 and 0.7 < a < 1.4
    assert fit_factors(hot + 10.0 * part, hot, part)[1] == FACTOR_RANGE[1]  # kept within their ranges
    assert fit_factors(0.2 * hot, hot, part) == (HOT_RANGE[0], pytest.approx(0.0, abs=1e-9))
    assert fit_factors(5.0 * (hot + part), hot, part)[0] == HOT_RANGE[1]
    # a cache part too small to tell from the hot figure: left at 1, the hot figure takes the excess
    tiny = hot * 1e-3
    r, a = fit_factors(1.2 * (hot + tiny), hot, tiny)
    assert a == 1.0 and r * hot.sum() + tiny.sum() == pytest.approx(1.2 * (hot + tiny).sum())


def test_a_probe_keeps_the_session_of_the_median_whole_ratio(probe, monkeypatch):
    """Every session runs and is fitted; the one whose tasks ran at the median ratio to their lanes counts."""
    import importlib

    import tilecast.loop.step_probe as step_probe

    measure = importlib.import_module("tilecast.loop.measure")  # the module (the package exports a function of its name)
    from_trace = importlib.import_module("tilecast.perfmodel.from_trace")
    machine, g, cal = probe
    lanes, hot = _lane_durations(machine, g, cal), _hot(machine, g, cal)
    scales = iter([1.2, 1.05, 1.1])

    class Run:  # a measured round: its traces give each task ``scale`` x its hot figure plus its cache part
        def __init__(self, scale):
            self.graph, self.traces = g, [scale]

    monkeypatch.setattr(measure, "measure_round", lambda *a, **k: (None, None, Run(next(scales))))
    monkeypatch.setattr(from_trace, "task_seconds", lambda graph, t: t * hot + (lanes - hot))
    factors, source, sums = step_probe.measure_in_step_factors(machine, cal, sessions=3)
    assert factors == pytest.approx((1.1, 1.0), abs=1e-6) and source.startswith("measured: ")
    assert "hot figure x1.100" in source and "cache part" in source
    assert len(sums["whole_ratios"]) == 3 and sums["whole_ratios"] == sorted(sums["whole_ratios"])


def test_a_calibration_without_lane_figures_cannot_be_fitted(probe):
    machine, g, cal = probe
    bare = Calibration(cal.machine, cal.fingerprint, cal.kind, cal.timer)
    factors, sums = fit_in_step_factors(g, np.ones(g.n_tasks), machine, bare)
    assert factors is None and "lane" in sums["why"]


def test_forecasts_scale_the_hot_figure_and_the_cache_part_by_the_factors(probe):
    machine, g, cal = probe
    one, scaled, hot = _lane_durations(machine, g, cal), _lane_durations(machine, g, cal, 1.3), _hot(machine, g, cal)
    assert np.allclose(scaled, hot + 1.3 * (one - hot), rtol=1e-12)
    assert np.allclose(_lane_durations(machine, g, cal, 0.0), hot, rtol=1e-12)
    both = _lane_durations(machine, g, cal, 1.3, hot=1.1)
    assert np.allclose(both, 1.1 * hot + 1.3 * (one - hot), rtol=1e-12)
    from tilecast.perfmodel.task_lanes import lanes_of  # the simulation's hot figures are the scaled ones

    d = DurationModel(machine.with_workers(1), dataclasses.replace(cal, in_step_hot=1.1)).durations(g)
    assert np.allclose(lanes_of(d).hot[0], 1.1 * hot, rtol=1e-12)
    cal.in_step_factor = 1.3
    try:  # the simulation's per-worker durations (task_lanes) scale alike: the step between as timed and 1.3x
        from tilecast.simulator.simulate import simulate

        m = machine.with_workers(1).with_task_overhead(0.0)
        d1 = DurationModel(m, dataclasses.replace(cal, in_step_factor=1.0)).durations(g)
        d2 = DurationModel(m, cal).durations(g)
        r1, r2 = simulate(g, m, "eager", durations=d1), simulate(g, m, "eager", durations=d2)
        assert r1.makespan < r2.makespan < 1.3 * r1.makespan
    finally:
        cal.in_step_factor = 1.0


def test_the_factor_is_stored_with_the_calibration(probe, tmp_path):
    machine, g, cal = probe
    c = dataclasses.replace(cal, in_step_factor=1.17, in_step_hot=1.08, in_step_source="measured: a probe")
    path = c.save(str(tmp_path / "cal.json"))
    back = Calibration.load(path)
    assert (back.in_step_factor, back.in_step_hot, back.in_step_source) == (1.17, 1.08, "measured: a probe")
    assert (back.without_points().in_step_factor, back.without_points().in_step_hot) == (1.17, 1.08)  # kept
    doc = json.loads(open(path).read())
    doc["in_step_factor"] = -1
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match="in_step_factor"):
        Calibration.load(str(tmp_path / "bad.json"))
    doc["in_step_factor"], doc["in_step_hot"] = 1.0, "fast"
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match="in_step_hot"):
        Calibration.load(str(tmp_path / "bad.json"))
    old = {k: v for k, v in json.loads(open(path).read()).items() if not k.startswith("in_step")}
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert Calibration.load(str(tmp_path / "old.json")).in_step_factor == 1.0  # files from before: the lanes as timed
    for part in (None, "cache"):  # a factor of the whole figure, or of the cache part alone: measured again
        older = {k: v for k, v in json.loads(open(path).read()).items() if k != "in_step_part"}
        if part:
            older["in_step_part"] = part
        (tmp_path / "older.json").write_text(json.dumps(older))
        back = Calibration.load(str(tmp_path / "older.json"))
        assert (back.in_step_factor, back.in_step_hot, back.in_step_source) == (1.0, 1.0, "")


def test_a_figure_learned_from_a_trace_is_not_scaled_again(probe):
    from tilecast.kernels import all_kernels
    from tilecast.perfmodel.calibration import TRACE
    from tilecast.perfmodel.shapes import graph_shapes

    machine, g, cal = probe
    learned = dataclasses.replace(cal, points={k: {f: list(v) for f, v in e.items()} for k, e in cal.points.items()})
    ks = next(ks for ks in graph_shapes(g) if all_kernels()[ks.kernel].name == "gemm")
    learned.add("gemm", ks.shapes[0], 5e-5, 0.0, TRACE)  # an in-step figure for one gemm shape
    tasks = ks.tasks[ks.inverse == 0]
    one, scaled = _lane_durations(machine, g, learned), _lane_durations(machine, g, learned, 1.3)
    assert len(tasks) and np.array_equal(scaled[tasks], one[tasks]) and np.allclose(one[tasks], 5e-5)
    rest = np.setdiff1d(np.arange(g.n_tasks), tasks)
    hot = _hot(machine, g, learned)
    assert np.allclose(scaled[rest], hot[rest] + 1.3 * (one[rest] - hot[rest]), rtol=1e-12)
    assert (scaled[rest] > one[rest]).any()


def test_a_lane_timed_below_its_hot_figure_stays_a_duration_when_scaled(probe):
    """A near or cold lane timed below its hot figure (noise on a sub-microsecond shape) has a negative cache
    part; the factor's largest value must not turn it into a negative duration, which the simulator refuses."""
    from tilecast.kernels import all_kernels
    from tilecast.perfmodel.calibration import STARPU_TASKS
    from tilecast.perfmodel.shapes import graph_shapes
    from tilecast.simulator.simulate import simulate

    machine, g, cal = probe
    low = Calibration(cal.machine, cal.fingerprint, cal.kind, STARPU_TASKS)
    for ks in graph_shapes(g):
        name = all_kernels()[ks.kernel].name
        for shape in ks.shapes:  # gemm's near and cold lanes 50-100x under its hot one; the others as usual
            cold, near = (2e-7, 1e-7) if name == "gemm" else (3e-5, 1.5e-5)
            low.add(name, shape, cold, 0.0, STARPU_TASKS)
            low.add_hot(name, shape, 1e-5)
            low.add_near(name, shape, near)
    low.cache_bytes, low.llc_bytes = cal.cache_bytes, cal.llc_bytes
    m = machine.with_workers(1)
    one = _lane_durations(machine, g, low)
    top = DurationModel(m, dataclasses.replace(low, in_step_factor=FACTOR_RANGE[1])).durations(g)
    gemm = g.kernel == [k.name for k in all_kernels()].index("gemm")
    assert (one[gemm] < 1e-5).any()  # some gemm tasks are not all hot: their figure is below hot
    assert (top >= 0).all() and (top[0, gemm] <= one[gemm]).all()
    assert simulate(g, m, "eager", durations=top).makespan > 0  # per-worker cache shares of the same figures
