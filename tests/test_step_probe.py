"""The in-step factor: a traced probe step's tasks against their own lane figures, and the lanes' cache part
scaled by it in forecasts."""

import dataclasses
import json

import numpy as np
import pytest
from test_shared_cache import _calibration

from tilecast.loop.step_probe import FACTOR_RANGE, PROBE_MODEL, fit_in_step_factor, probe_config, probe_graph
from tilecast.perfmodel import load_machine
from tilecast.perfmodel.calibration import Calibration, CalibrationError
from tilecast.perfmodel.kernel_model import DurationModel


@pytest.fixture(scope="module")
def probe():
    machine = load_machine("local")
    g = probe_graph()
    return machine, g, _calibration(g, machine)


def _lane_durations(machine, graph, cal, factor=1.0):
    return DurationModel(machine.with_workers(1), dataclasses.replace(cal, in_step_factor=factor)).durations(graph)[0]


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


def test_the_factor_is_the_traced_cache_part_over_the_lanes(probe):
    machine, g, cal = probe
    lanes, hot = _lane_durations(machine, g, cal), _hot(machine, g, cal)
    assert lanes.sum() > hot.sum()  # the probe's tasks have a cache part to scale
    traced = hot + 1.25 * (lanes - hot)
    factor, sums = fit_in_step_factor(g, traced, machine, cal)
    assert factor == pytest.approx(1.25) and sums["tasks"] == g.n_tasks
    assert sums["whole_ratio"] == pytest.approx(traced.sum() / lanes.sum())
    assert fit_in_step_factor(g, lanes, machine, cal)[0] == pytest.approx(1.0)  # as the lanes say: 1
    assert fit_in_step_factor(g, hot, machine, cal)[0] == pytest.approx(0.0, abs=1e-12)  # all hot: 0
    traced[::3] = np.nan  # tasks missing from the trace are left out of every sum
    traced[1] = 100.0 * lanes[1]  # and one outlier moves the sums, not a median
    factor, sums = fit_in_step_factor(g, traced, machine, cal)
    assert sums["tasks"] == g.n_tasks - len(range(0, g.n_tasks, 3)) and factor > 1.25
    assert fit_in_step_factor(g, 5.0 * lanes, machine, cal)[0] == FACTOR_RANGE[1]  # kept within its range
    assert fit_in_step_factor(g, 0.5 * hot, machine, cal)[0] == FACTOR_RANGE[0]


def test_a_cache_part_within_the_lanes_noise_is_not_fitted(probe, monkeypatch):
    import tilecast.loop.step_probe as step_probe

    machine, g, cal = probe
    lanes, hot = _lane_durations(machine, g, cal), _hot(machine, g, cal)
    part = 1 - hot.sum() / lanes.sum()
    assert step_probe.fit_in_step_factor(g, lanes, machine, cal)[0] == pytest.approx(1.0)
    monkeypatch.setattr(step_probe, "MIN_CACHE_PART", part + 0.01)  # the probe's cache part just under the least
    factor, sums = step_probe.fit_in_step_factor(g, 1.1 * lanes, machine, cal)
    assert factor is None and "too little to scale" in sums["why"] and f"{100 * part:.1f}%" in sums["why"]
    assert sums["whole_ratio"] == pytest.approx(1.1)  # how the tasks ran against their lanes is still reported


def test_a_probe_too_little_to_scale_says_how_its_tasks_ran(probe, monkeypatch):
    """Every session runs; the source gives the median of their whole ratios (the tasks against their lanes)."""
    import importlib

    import tilecast.loop.step_probe as step_probe

    measure = importlib.import_module("tilecast.loop.measure")  # the module (the package exports a function of its name)
    from_trace = importlib.import_module("tilecast.perfmodel.from_trace")
    machine, g, cal = probe
    lanes, hot = _lane_durations(machine, g, cal), _hot(machine, g, cal)
    monkeypatch.setattr(step_probe, "MIN_CACHE_PART", 1 - hot.sum() / lanes.sum() + 0.01)
    scales = iter([1.2, 1.05, 1.1])

    class Run:  # a measured round: its traces give each task ``scale`` x its lane figure
        def __init__(self, scale):
            self.graph, self.traces = g, [scale]

    monkeypatch.setattr(measure, "measure_round", lambda *a, **k: (None, None, Run(next(scales))))
    monkeypatch.setattr(from_trace, "task_seconds", lambda graph, t: t * lanes)
    factor, source, sums = step_probe.measure_in_step_factor(machine, cal, sessions=3)
    assert factor is None and source.startswith("not measured: ") and "too little to scale" in source
    assert "tasks 1.100x their lane figures (the median of 3 sessions)" in source
    assert sums["whole_ratios"] == pytest.approx([1.05, 1.1, 1.2])


def test_a_calibration_without_lane_figures_cannot_be_fitted(probe):
    machine, g, cal = probe
    bare = Calibration(cal.machine, cal.fingerprint, cal.kind, cal.timer)
    factor, sums = fit_in_step_factor(g, np.ones(g.n_tasks), machine, bare)
    assert factor is None and "lane" in sums["why"]


def test_forecasts_scale_the_cache_part_by_the_factor(probe):
    machine, g, cal = probe
    one, scaled, hot = _lane_durations(machine, g, cal), _lane_durations(machine, g, cal, 1.3), _hot(machine, g, cal)
    assert np.allclose(scaled, hot + 1.3 * (one - hot), rtol=1e-12)
    assert np.allclose(_lane_durations(machine, g, cal, 0.0), hot, rtol=1e-12)
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
    c = dataclasses.replace(cal, in_step_factor=1.17, in_step_source="measured: a probe")
    path = c.save(str(tmp_path / "cal.json"))
    back = Calibration.load(path)
    assert (back.in_step_factor, back.in_step_source) == (1.17, "measured: a probe")
    assert back.without_points().in_step_factor == 1.17  # kept when runs are learned on top
    doc = json.loads(open(path).read())
    doc["in_step_factor"] = -1
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match="in_step_factor"):
        Calibration.load(str(tmp_path / "bad.json"))
    old = {k: v for k, v in json.loads(open(path).read()).items() if not k.startswith("in_step")}
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert Calibration.load(str(tmp_path / "old.json")).in_step_factor == 1.0  # files from before: the lanes as timed
    whole = {k: v for k, v in json.loads(open(path).read()).items() if k != "in_step_part"}
    (tmp_path / "whole.json").write_text(json.dumps(whole))
    back = Calibration.load(str(tmp_path / "whole.json"))  # a factor of the whole figure: measured again
    assert (back.in_step_factor, back.in_step_source) == (1.0, "")


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
