"""The in-step factors: a traced probe step's tasks against their own lane figures, and the lanes' hot figure
and cache part scaled by them in forecasts."""

import dataclasses
import json

import numpy as np
import pytest
from test_shared_cache import _calibration

from tilecast.loop.step_probe import (BYTE_RANGE, FACTOR_RANGE, HOT_RANGE, PROBE_MODEL, fit_factors,
                                     fit_in_step_factors, probe_config, probe_graph)
from tilecast.perfmodel import load_machine
from tilecast.perfmodel.calibration import Calibration, CalibrationError
from tilecast.perfmodel.kernel_model import DurationModel


@pytest.fixture(scope="module")
def probe():
    machine = load_machine("local")
    g = probe_graph()
    return machine, g, _calibration(g, machine)


def _lane_durations(machine, graph, cal, factor=1.0, hot=1.0, per_byte=0.0):
    c = dataclasses.replace(cal, in_step_factor=factor, in_step_hot=hot, in_step_byte_s=per_byte)
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


def test_the_terms_are_those_the_traced_tasks_were_made_with(probe):
    from tilecast.perfmodel.reuse import task_bytes

    machine, g, cal = probe
    lanes, hot, nbytes = _lane_durations(machine, g, cal), _hot(machine, g, cal), task_bytes(g)
    assert lanes.sum() > hot.sum()  # the probe's tasks have a cache part to scale
    for r, a, b in ((1.0, 1.25, 0.0), (1.08, 0.8, 15e-12), (0.9, 0.0, 0.0), (1.1, 1.1, 0.0), (1.0, 1.0, 0.0)):
        traced = r * hot + a * (lanes - hot) + b * nbytes
        terms, sums = fit_in_step_factors(g, traced, machine, cal)
        # each term to its own scale: the factors are near 1, the cost per byte some picoseconds (a factor of 0 came
        # out 7.6e-15 on an AMD EPYC guest)
        assert terms[:2] == pytest.approx((r, a), rel=1e-6, abs=1e-9) and sums["tasks"] == g.n_tasks
        assert terms[2] == pytest.approx(b, rel=1e-6, abs=1e-18)
        assert sums["whole_ratio"] == pytest.approx(traced.sum() / lanes.sum())
        assert sums["hot_span_s"] == pytest.approx(hot.max())  # the fit's range: the longest hot figure
    traced = 1.2 * hot + 1.1 * (lanes - hot) + 5e-12 * nbytes
    traced[::3] = np.nan  # tasks missing from the trace are left out of every sum
    terms, sums = fit_in_step_factors(g, traced, machine, cal)
    assert sums["tasks"] == g.n_tasks - len(range(0, g.n_tasks, 3))
    assert terms == pytest.approx((1.2, 1.1, 5e-12), rel=1e-6)


def test_the_fit_matches_the_probes_sum_and_keeps_its_ranges():
    rng = np.random.default_rng(1)
    hot = rng.uniform(1e-6, 1e-4, 400)
    part = hot * rng.uniform(0.0, 0.6, 400)
    nbytes = hot * 2e9 * rng.uniform(0.2, 5.0, 400)  # memory-bound tasks and compute-bound ones
    made = 1.1 * hot + 0.8 * part + 15e-12 * nbytes
    traced = made * rng.lognormal(0.0, 0.1, 400)  # noisy tasks: the sum is still matched
    r, a, b = fit_factors(traced, hot, part, nbytes)
    assert r * hot.sum() + a * part.sum() + b * nbytes.sum() == pytest.approx(traced.sum())
    assert 1.0 < r < 1.2 and 0.5 < a < 1.1 and 5e-12 < b < 25e-12
    assert fit_factors(hot + 10.0 * part, hot, part, nbytes)[1] == FACTOR_RANGE[1]  # kept within their ranges
    assert fit_factors(0.2 * hot, hot, part, nbytes)[0] == HOT_RANGE[0]
    assert fit_factors(5.0 * (hot + part), hot, part, nbytes)[0] == HOT_RANGE[1]
    assert fit_factors(hot + part + 5e-9 * nbytes, hot, part, nbytes)[2] == BYTE_RANGE[1]
    # tasks that ran shorter the more bytes they had: no cost per byte, the others fitted without it
    r, a, b = fit_factors(hot + part - 2e-12 * nbytes, hot, part, nbytes)
    assert b == 0.0 and r * hot.sum() + a * part.sum() == pytest.approx((hot + part - 2e-12 * nbytes).sum())
    # a cache part too small to tell from the hot figure: left at 1, the others take the excess
    tiny = hot * 1e-3
    r, a, b = fit_factors(1.2 * (hot + tiny), hot, tiny, nbytes)
    assert a == 1.0 and r * hot.sum() + tiny.sum() + b * nbytes.sum() == pytest.approx(1.2 * (hot + tiny).sum())


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
    terms, source, sums = step_probe.measure_in_step_factors(machine, cal, sessions=3)
    assert terms == pytest.approx((1.1, 1.0, 0.0), abs=1e-6) and source.startswith("measured: ")
    assert "hot figure x1.100" in source and "cache part" in source and "0.0 ps a byte" in source
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
    from tilecast.perfmodel.reuse import task_bytes

    per_byte = _lane_durations(machine, g, cal, 1.3, hot=1.1, per_byte=2e-11)
    assert np.allclose(per_byte, both + 2e-11 * task_bytes(g), rtol=1e-12)
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


def test_the_hot_factor_adds_no_more_to_a_task_longer_than_the_probes_longest(probe):
    """Past the probe's longest hot figure (the fit's range) a task gains what that one gained, not its share."""
    from tilecast.perfmodel.reuse import task_bytes

    machine, g, cal = probe
    one, hot = _lane_durations(machine, g, cal), _hot(machine, g, cal)
    span = float(np.median(hot))
    c = dataclasses.replace(cal, in_step_factor=1.3, in_step_hot=1.2, in_step_byte_s=1e-11, in_step_hot_span_s=span)
    capped = DurationModel(machine.with_workers(1), c).durations(g)[0]
    want = hot + 0.2 * np.minimum(hot, span) + 1e-11 * task_bytes(g) + 1.3 * (one - hot)
    assert np.allclose(capped, want, rtol=1e-12)
    long = hot > span
    assert long.any() and (capped[long] < _lane_durations(machine, g, cal, 1.3, 1.2, 1e-11)[long]).all()
    assert np.allclose(capped[~long], _lane_durations(machine, g, cal, 1.3, 1.2, 1e-11)[~long], rtol=1e-12)


def test_the_factor_is_stored_with_the_calibration(probe, tmp_path):
    machine, g, cal = probe
    c = dataclasses.replace(cal, in_step_factor=1.17, in_step_hot=1.08, in_step_byte_s=1.5e-11,
                            in_step_hot_span_s=2.5e-4, in_step_source="measured: a probe")
    path = c.save(str(tmp_path / "cal.json"))
    back = Calibration.load(path)
    assert (back.in_step_factor, back.in_step_hot, back.in_step_byte_s) == (1.17, 1.08, 1.5e-11)
    assert back.in_step_source == "measured: a probe"
    kept = back.without_points()  # kept when runs are learned on top
    assert back.in_step_hot_span_s == 2.5e-4 and kept.in_step_hot_span_s == 2.5e-4
    assert (kept.in_step_factor, kept.in_step_hot, kept.in_step_byte_s) == (1.17, 1.08, 1.5e-11)
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
    for part in (None, "cache", "hot and cache", "hot, cache and bytes"):  # earlier forms of the terms: measured again
        older = {k: v for k, v in json.loads(open(path).read()).items() if k != "in_step_part"}
        if part:
            older["in_step_part"] = part
        (tmp_path / "older.json").write_text(json.dumps(older))
        back = Calibration.load(str(tmp_path / "older.json"))
        assert (back.in_step_factor, back.in_step_hot, back.in_step_byte_s, back.in_step_source) == (1.0, 1.0, 0.0, "")
        assert back.in_step_hot_span_s == 0.0


def test_a_figure_learned_from_a_trace_is_not_scaled_again(probe):
    from tilecast.kernels import all_kernels
    from tilecast.perfmodel.calibration import TRACE
    from tilecast.perfmodel.shapes import graph_shapes

    machine, g, cal = probe
    learned = dataclasses.replace(cal, points={k: {f: list(v) for f, v in e.items()} for k, e in cal.points.items()})
    ks = next(ks for ks in graph_shapes(g) if all_kernels()[ks.kernel].name == "gemm")
    learned.add("gemm", ks.shapes[0], 5e-5, 0.0, TRACE)  # an in-step figure for one gemm shape
    tasks = ks.tasks[ks.inverse == 0]
    one, scaled = _lane_durations(machine, g, learned), _lane_durations(machine, g, learned, 1.3, 1.2, 1e-11)
    assert len(tasks) and np.array_equal(scaled[tasks], one[tasks]) and np.allclose(one[tasks], 5e-5)
    rest = np.setdiff1d(np.arange(g.n_tasks), tasks)
    hot = _hot(machine, g, learned)
    from tilecast.perfmodel.reuse import task_bytes

    extra = 1e-11 * task_bytes(g)[rest]
    assert np.allclose(scaled[rest], 1.2 * hot[rest] + 1.3 * (one[rest] - hot[rest]) + extra, rtol=1e-12)
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
