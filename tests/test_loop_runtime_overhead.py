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
