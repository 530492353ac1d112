"""The runtime's cost per task, read back from traces whose cost per task is known."""

import numpy as np
import pandas as pd
import pytest

from sim_graphs import gemm_chain_graph, random_graph
from sim_machines import cpu_machine
from tilecast.loop.runtime_overhead import start_delays, task_overhead
from tilecast.simulator.simulate import simulate


@pytest.mark.parametrize("sched", ["eager", "dmda", "lws"])
def test_the_overhead_a_simulation_charged_is_read_back_from_its_trace(sched):
    rng = np.random.default_rng(3)
    g = random_graph(rng, 300, 20)
    m = cpu_machine(n_workers=3, overhead_us=7.0)
    durations = rng.uniform(1e-5, 1e-4, size=(1, g.n_tasks))
    trace = simulate(g, m, sched, durations=durations).trace()
    d = start_delays(g, trace)
    assert len(d) == g.n_tasks - 3  # each worker's first task left out
    assert d == pytest.approx(np.full(len(d), 7e-6), abs=1e-12)
    assert task_overhead(g, trace) == pytest.approx(7e-6, abs=1e-12)


def test_waits_beyond_the_inputs_and_the_worker_count_and_the_largest_are_trimmed():
    g = gemm_chain_graph(n_layers=2, tiles=2)  # 16 tasks; layer 1's tasks read layer 0's outputs
    m = cpu_machine(n_workers=2, overhead_us=0.0)
    trace = simulate(g, m, "eager", durations=np.full((1, g.n_tasks), 1e-4)).trace()
    tasks = trace[trace["task"] >= 0].copy()
    assert start_delays(g, tasks) == pytest.approx(np.zeros(g.n_tasks - 2), abs=1e-12)
    # one task starts 50 us late: its delay is exactly that, and the mean drops it as the largest 2%
    late = tasks.sort_values("start_s").iloc[-1]["task"]
    tasks.loc[tasks["task"] == late, ["start_s", "end_s"]] += 5e-5
    d = start_delays(g, tasks)
    assert d.max() == pytest.approx(5e-5) and np.sum(d > 1e-9) == 1
    assert task_overhead(g, tasks, trim=0.0) == pytest.approx(5e-5 / len(d))
    assert task_overhead(g, tasks) == pytest.approx(0.0, abs=1e-12)


def test_a_trace_without_tasks_is_refused():
    g = gemm_chain_graph(n_layers=1, tiles=1)
    empty = pd.DataFrame({"task": [-1], "worker": [0], "start_s": [0.0], "end_s": [1.0]})
    with pytest.raises(ValueError, match="no task rows"):
        task_overhead(g, empty)


@pytest.mark.parametrize("sched", ["eager", "dmda"])
def test_the_costs_between_tasks_a_simulation_charged_are_read_back_from_its_trace(sched):
    """Per buffer of the starting task, per buffer and per successor of the worker's ended task, per handoff
    from another worker: each gap is exactly what was charged (when the worker, not an input, held the task
    back), and the fit finds the costs (on one worker, where nothing is handed over, the handoff's is 0)."""
    from tilecast.loop.runtime_overhead import fit_gap_model, gap_terms

    rng = np.random.default_rng(4)
    g = random_graph(rng, 400, 20)
    costs = np.array([3e-6, 2e-6, 0.5e-6, 1.5e-6, 2.5e-6, 4e-6])
    m = cpu_machine(n_workers=2, overhead_us=costs[0] * 1e6).with_gap_costs(*costs[1:])
    durations = rng.uniform(1e-5, 1e-4, size=(1, g.n_tasks))
    trace = simulate(g, m, sched, durations=durations).trace()
    d, x = gap_terms(g, trace)
    charged = x @ costs
    held = d >= charged - 1e-12  # a task whose input came later than the worker was free waits less
    assert held.mean() > 0.25 and d[held] == pytest.approx(charged[held], abs=1e-12)
    assert np.all(d <= charged + 1e-12)
    assert 0.05 < x[:, 5].mean() < 0.95  # tasks handed over between the two workers, and tasks that were not
    one = cpu_machine(n_workers=1, overhead_us=costs[0] * 1e6).with_gap_costs(*costs[1:])
    solo = simulate(g, one, sched, durations=durations).trace()  # one worker: every gap is the charge
    assert fit_gap_model([(g, solo)]) == pytest.approx([*costs[:5], 0.0], rel=1e-6, abs=1e-12)


def _solo_trace_with_extra_waits(every: int, extra_s: float):
    """A one-worker simulated trace whose every ``every``-th gap (in start order) is ``extra_s`` longer (the
    tasks after it shifted by as much), the graph, the costs charged and the extras added."""
    rng = np.random.default_rng(5)
    g = random_graph(rng, 400, 20)
    costs = np.array([3e-6, 2e-6, 0.5e-6, 1.5e-6, 2.5e-6, 0.0])
    m = cpu_machine(n_workers=1, overhead_us=costs[0] * 1e6).with_gap_costs(*costs[1:])
    trace = simulate(g, m, "eager", durations=rng.uniform(1e-5, 1e-4, size=(1, g.n_tasks))).trace()
    tasks = trace[trace["task"] >= 0].sort_values("start_s").reset_index(drop=True)
    shift = np.zeros(len(tasks))
    shift[every::every] = extra_s
    shift = np.cumsum(shift)  # a late task delays every later one on the one worker, by as much
    tasks["start_s"] += shift
    tasks["end_s"] += shift
    return g, tasks, costs, extra_s * ((len(tasks) - 1) // every)


def test_the_fit_gives_the_mean_delay_where_the_trim_gives_the_typical_one():
    """Every 25th gap 8 us longer: the trimmed fit leaves most of that out; with ``mean`` its constant rises
    so that the model's mean delay over the trace is the trace's (a makespan adds every delay up)."""
    from tilecast.loop.runtime_overhead import fit_gap_model, gap_terms, mean_excess

    g, tasks, costs, added = _solo_trace_with_extra_waits(25, 8e-6)
    d, x = gap_terms(g, tasks)
    assert d.sum() == pytest.approx((x @ costs).sum() + added, rel=1e-9)
    typical = fit_gap_model([(g, tasks)], mean=False)
    fitted = fit_gap_model([(g, tasks)])
    assert (x @ typical).mean() < d.mean() - 0.1e-6  # the trim left out some of the extra waits
    assert (x @ fitted).mean() == pytest.approx(d.mean(), rel=1e-9)
    assert fitted[1:] == pytest.approx(typical[1:]) and fitted[0] > typical[0]
    assert mean_excess([(g, tasks)], costs) == pytest.approx(added / len(d), rel=1e-9)


def test_a_preempted_worker_is_not_the_runtimes_cost():
    """A wait of 2 ms (a time slice lost to another process) does not move the constant; the same wait
    counts where every delay is asked for."""
    from tilecast.loop.runtime_overhead import fit_gap_model, gap_terms, mean_excess

    g, tasks, costs, _ = _solo_trace_with_extra_waits(300, 2e-3)
    d, _ = gap_terms(g, tasks)
    assert np.sum(d > 1e-3) == 1
    assert mean_excess([(g, tasks)], costs) == pytest.approx(0.0, abs=1e-12)
    assert mean_excess([(g, tasks)], costs, preempted_s=None) == pytest.approx(2e-3 / len(d), rel=1e-9)
    assert fit_gap_model([(g, tasks)]) == pytest.approx([*costs[:5], 0.0], rel=1e-6, abs=1e-12)


def test_what_runs_wait_beyond_their_simulation_is_read_per_task():
    """The delay excess of a run over its simulation: 0 for the simulated trace itself, the added waits per
    delay for the trace with extra waits (the median over several traces)."""
    from tilecast.loop.runtime_overhead import delay_excess, start_delays

    g, late, costs, added = _solo_trace_with_extra_waits(10, 3e-6)
    m = cpu_machine(n_workers=1, overhead_us=costs[0] * 1e6).with_gap_costs(*costs[1:5])
    rng = np.random.default_rng(5)
    random_graph(rng, 400, 20)  # the same draws as the helper's, for the same durations
    sim = simulate(g, m, "eager", durations=rng.uniform(1e-5, 1e-4, size=(1, g.n_tasks))).trace()
    n = len(start_delays(g, late))
    assert delay_excess(g, [sim], sim) == pytest.approx(0.0, abs=1e-15)
    assert delay_excess(g, [sim, late, late], sim) == pytest.approx(added / n, rel=1e-9)


def test_a_fit_whose_constant_would_go_below_zero_shrinks_its_other_costs_to_the_mean_delay():
    """Two small traces with the costs ``c`` and one four times larger with 4 ``c``: the pooled fit's costs per
    buffer and successor are the large trace's, above what the median trace waits, so the constant alone
    cannot bring the model to the median trace's mean delay without going below 0; it is 0 and the other
    costs shrink, keeping their proportions, until the model gives that mean."""
    from tilecast.loop.runtime_overhead import fit_gap_model, mean_excess

    rng = np.random.default_rng(6)
    costs = np.array([0.5e-6, 2e-6, 0.5e-6, 1.5e-6, 2.5e-6, 0.0])
    samples = []
    for n, k in ((150, 1.0), (150, 1.0), (1200, 4.0)):
        g = random_graph(rng, n, 20)
        m = cpu_machine(n_workers=1, overhead_us=costs[0] * k * 1e6).with_gap_costs(*(costs[1:] * k))
        samples.append((g, simulate(g, m, "eager", durations=rng.uniform(1e-5, 1e-4, size=(1, n))).trace()))
    typical = fit_gap_model(samples, mean=False)
    assert typical[0] + mean_excess(samples, typical) < 0  # the constant alone would go below 0
    fitted = fit_gap_model(samples)
    assert fitted[0] == 0.0 and np.all(fitted[1:] < typical[1:] + 1e-15) and fitted[1:].sum() > 0
    assert fitted[1:] / fitted[1:].sum() == pytest.approx(typical[1:] / typical[1:].sum(), rel=1e-9)
    assert mean_excess(samples, fitted) == pytest.approx(0.0, abs=1e-12)
