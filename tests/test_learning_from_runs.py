"""Learning from measured runs: what a run teaches must bring its own prediction closer, on 1 and 2 workers."""

import time

import numpy as np
import pytest
from sim_graphs import gemm_chain_graph

from tilecast.loop import host_cost
from tilecast.loop.host_cost import HostCost, calibrated_only, fit_key, probe_key
from tilecast.loop.tune import starpu_policies
from tilecast.perfmodel import load_machine
from tilecast.perfmodel.calibration import STARPU_TASKS, TRACE, Calibration
from tilecast.perfmodel.from_trace import calibration_from_trace
from tilecast.trace import make_trace

from loop_home import loop_home, loop_home_dir  # noqa: F401

TRIES = 3
needs_starpu = pytest.mark.skipif(starpu_policies() is None, reason="StarPU or the C kernels are not available here")


def _probe(workers, ready, scan=0.0):
    p = HostCost.fit(workers, [[10, 10, 0.01, 0.001], [100, 100, 0.02, 0.002], [300, 900, 0.05, 0.003]],
                     overheads=[[1000, 9e-6]])
    p.probe_points = 3
    p.task_overhead_s = 1e-6
    p.gap_start_buffer_s, p.gap_end_buffer_s, p.gap_successor_s, p.gap_ready_s = 2e-7, 2e-7, 1e-7, ready
    p.decision_scan_s, p.decision_lock_s = scan, 10 * scan
    p.submit_task_s = 3e-6
    return p


def test_runs_learned_on_the_first_use_view_keep_each_schedulers_own_costs():
    # as `tilecast calibrate` stores them: eager's probe fit under the worker count, the others' under probe keys
    eager, dmda, dmdasd = _probe(2, 1e-6), _probe(2, 3e-6), _probe(2, 3e-6, scan=1e-7)
    stored = {2: eager, probe_key(2, "dmda"): dmda, fit_key(2, "dmda"): dmda,
              probe_key(2, "dmdasd"): dmdasd, fit_key(2, "dmdasd"): dmdasd}
    view = calibrated_only(stored)  # what accuracy predicts first use from, and learns held out / repeatability on
    assert view[probe_key(2, "dmda")] is dmda and view[fit_key(2, "dmda")] is dmda
    runs = [(2, "dmda", 500, 4800, 0.06, 0.065, 30e-6), (2, "dmdasd", 500, 8700, 0.2, 0.21, 30e-6),
            (2, "eager", 500, 4800, 0.05, 0.053, 20e-6)]
    for fits in (view, {k: v for k, v in view.items() if not str(k).startswith("probe:")}):
        taught = host_cost.learn_from_runs(fits, runs)
        # a scheduler's cost between tasks, decisions and submission stay as its own probes measured them
        # (they were eager's, and dmdasd's decisions were dropped: dmdasd then learned 50-77% too fast)
        assert taught["2:dmda"].gap_costs == dmda.gap_costs and taught["2:dmda"].task_overhead_s == 1e-6
        assert taught["2:dmda"].submit_task_s == dmda.submit_task_s
        assert (taught["2:dmdasd"].decision_scan_s, taught["2:dmdasd"].decision_lock_s) == (1e-7, 1e-6)
        assert taught["2:eager"].gap_costs == eager.gap_costs
        assert len(taught["2:dmda"].points) == 4  # the run taught the host cost


def _trace(graph, seconds, workers):
    n = graph.n_tasks
    start = np.cumsum(np.concatenate(([0.0], seconds[:-1])))
    return make_trace(task=np.arange(n), kernel="gemm", worker=np.arange(n) % workers, node=0, start_s=start,
                      end_s=start + seconds, bytes=0, flops=0.0, source="real", tag="")


def test_steps_on_one_and_two_workers_are_learned_apart(tmp_path):
    g = gemm_chain_graph(n_layers=2, tiles=2, tile=32)
    m = load_machine("local")
    base = Calibration(m.name, m.fingerprint(), m.kind_names[0], STARPU_TASKS)
    one, two = np.full(g.n_tasks, 2e-5), np.full(g.n_tasks, 3e-5)
    cal = calibration_from_trace(g, [_trace(g, one, 1)], m, base=base, workers=1)
    cal = calibration_from_trace(g, [_trace(g, two, 2)], m, base=cal, workers=2)
    assert set(cal.sources("gemm")) == {TRACE} and sorted(set(cal.point_workers("gemm"))) == [1, 2]
    np.testing.assert_allclose(cal.arrays("gemm", workers=1)[1], 2e-5)
    np.testing.assert_allclose(cal.arrays("gemm", workers=2)[1], 3e-5)
    # learning the same count again replaces that count's points only
    again = calibration_from_trace(g, [_trace(g, one * 1.5, 1)], m, base=cal, workers=1)
    np.testing.assert_allclose(again.arrays("gemm", workers=1)[1], 3e-5)
    np.testing.assert_allclose(again.arrays("gemm", workers=2)[1], 3e-5)
    assert len(again.points["gemm"]["shapes"]) == len(cal.points["gemm"]["shapes"])
    # a count never run takes a learned one, scaled by the kernel's one-worker ratio from calibration
    only2 = calibration_from_trace(g, [_trace(g, two, 2)], m, base=base, workers=2)
    only2.lane_workers = 2
    only2.worker_samples = {"gemm": [[1e5, 0.8e-5, 1e-5]] * 3}  # one worker: 0.8x two's time
    np.testing.assert_allclose(only2.arrays("gemm", workers=1)[1], 0.8 * 3e-5)
    np.testing.assert_allclose(only2.arrays("gemm", workers=2)[1], 3e-5)
    # stored and read back with the counts
    back = Calibration.load(only2.save(str(tmp_path / "cal.json")), m.fingerprint())
    assert back.point_workers("gemm") == only2.point_workers("gemm")


@needs_starpu
def test_a_run_learned_brings_its_own_prediction_closer(loop_home):  # noqa: F811
    """A small real step on 1 and 2 workers, measured and traced, learned, predicted again: the repeat prediction
    of the same configuration is no further from the measurement than the first: by at most 5 points at the
    median of the four. Not row by row: these steps take a few milliseconds, and prio's on two workers measured
    anywhere from 40% under to 40% over their first-use prediction in different runs on this 2-core machine;
    learned one-worker steps come out 2-5 points faster than measured, a known residual (docs/predicting.md)."""
    # Under load the learned prediction moves with the measurement it learned from: eight measurements against
    # one calibration on the 2-core AMD EPYC at load average 9-10 (2026-12-01) gave errors after learning of
    # -47% to +35% (medians of the four 8-19%), against 2-5 points quiet, and median changes of -2.38 to -0.48
    # (that calibration was slow: first use +2% to +589%); a run of its own at load average 11-14 measured steps
    # slow instead (first use -90% to +344%, after learning -88% to -12%) and gave -0.041, a point from the
    # bound. Up to TRIES measurements, apart, are learned in turn, each judged on its own: a learning that moves
    # predictions away from the run it learned fails every one of them.
    from tilecast.loop.accuracy_suite import suite_configs
    from tilecast.loop.execute import learn_from_measurements
    from tilecast.loop.host_cost import ensure_host_costs
    from tilecast.loop.kernel_calibration import ensure_calibration
    from tilecast.loop.measure import measure
    from tilecast.loop.predict import predict, relative_error

    configs = suite_configs("quick")  # two tiny shapes under eager and prio, on 1 and 2 workers
    machine = load_machine("local")
    host_all = ensure_host_costs(machine, sorted({c.workers for c in configs}), progress=False,
                                 scheds=sorted({c.sched for c in configs}))
    cal_all = ensure_calibration(machine, [c.build() for c in configs], progress=False)
    cal0, host0 = cal_all.calibrated_only(), calibrated_only(host_all)
    for attempt in range(TRIES):
        if attempt:
            time.sleep(5.0)  # apart, so that one slow phase of the machine is not measured twice
        measured = [measure(c, steps=8, warmup=1) for c in configs]
        cal1, host1 = learn_from_measurements(configs, measured, machine, cal0, host0)
        worse = []
        for c, m in zip(configs, measured):
            before = relative_error(predict(c, machine, cal0, host0, graph=m.graph).step_s, m.median_s)
            after = relative_error(predict(c, machine, cal1, host1, graph=m.graph).step_s, m.median_s)
            print(f"try {attempt + 1}, {c.label()}: first use {before:+.1%}, after learning its run {after:+.1%}")
            worse.append(abs(after) - abs(before))
            probe = host0.get(probe_key(c.workers, c.sched)) or host0[c.workers]
            assert host1[fit_key(c.workers, c.sched)].gap_costs == probe.gap_costs
        print(f"median change of the absolute error: {float(np.median(worse)):+.3f} ({np.round(worse, 3)})")
        if float(np.median(worse)) <= 0.05:
            break
    assert float(np.median(worse)) <= 0.05, worse


def test_what_a_graphs_runs_wait_beyond_their_simulation_is_charged_to_that_graph_alone(tmp_path, monkeypatch):
    """A run that waits 5 us more between its tasks than its simulation teaches 5 us per task to its own task
    graph; another tiling under the same scheduler keeps the probes' cost (a residual of one graph's learned
    durations made model shapes that never ran 4% slower at the median, docs/accuracy.md run 27); the
    lesson is stored and read back, and learned again on top of itself."""
    from types import SimpleNamespace

    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model
    from tilecast.loop.config import StepConfig
    from tilecast.loop.execute import learn_delay_excess
    from tilecast.loop.predict import predict

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    machine = load_machine("local")
    ran, other = (StepConfig(load_model("gpt2-tiny"), 1, 32, Tiling.uniform(t), "eager", 1) for t in (32, 16))
    assert ran.graph_id != other.graph_id
    fits = {1: _probe(1, 1e-7), fit_key(1, "eager"): _probe(1, 1e-7)}
    g = ran.build()
    sim = _simulated_trace(ran, machine, fits, g)
    tasks = sim[sim["task"] >= 0].sort_values("start_s").reset_index(drop=True)
    late = tasks.assign(start_s=tasks["start_s"] + 5e-6 * np.arange(len(tasks)),
                        end_s=tasks["end_s"] + 5e-6 * np.arange(len(tasks)))
    run = SimpleNamespace(graph=g, traces=[late], median_s=float(late["end_s"].max()))
    taught = learn_delay_excess([ran], [run], machine, None, fits)
    assert taught[fit_key(1, "eager")].graph_excess == {ran.graph_id: pytest.approx(5e-6, rel=1e-6)}
    assert taught[fit_key(1, "eager")].task_overhead_s == fits[fit_key(1, "eager")].task_overhead_s
    before = predict(ran, machine, None, fits, graph=g)
    after = predict(ran, machine, None, taught, graph=g)
    assert after.task_overhead_s == pytest.approx(before.task_overhead_s + 5e-6)
    assert after.step_s > before.step_s and "own runs" in after.task_overhead_source
    h = other.build()
    assert predict(other, machine, None, taught, graph=h).step_s == predict(other, machine, None, fits, graph=h).step_s
    host_cost.save_host_costs(machine, taught)
    back = host_cost.load_host_costs(machine)
    assert back[fit_key(1, "eager")].graph_excess == taught[fit_key(1, "eager")].graph_excess
    # learning the same run again from the taught fits: it now waits what its simulation does, nothing is added
    again = learn_delay_excess([ran], [SimpleNamespace(graph=g, traces=[_simulated_trace(ran, machine, taught, g)],
                                                       median_s=after.step_s)], machine, None, taught)
    assert again[fit_key(1, "eager")].graph_excess[ran.graph_id] == pytest.approx(5e-6, rel=1e-6)
    # learned runs keep every graph's lesson when the host cost is fitted again
    refit = host_cost.learn_from_runs(taught, [(1, "eager", h.n_tiles, h.n_tasks, 0.01, 0.011, 2e-6)])
    assert refit[fit_key(1, "eager")].graph_excess == taught[fit_key(1, "eager")].graph_excess


def _simulated_trace(config, machine, fits, graph):
    """The trace of ``config``'s simulated step with the host-cost ``fits`` (durations from the machine)."""
    from tilecast.loop.predict import predict

    return predict(config, machine, None, fits, graph=graph, keep_result=True).result.trace()
