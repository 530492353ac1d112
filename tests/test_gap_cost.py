"""The runtime's cost between tasks (per buffer, per successor): stored with the host costs, kept through what
runs teach, charged by predict, the StarPU termination work charged to the worker that ended the task."""

import json

import numpy as np
import pytest
from sim_graphs import gemm_chain_graph
from sim_machines import cpu_machine

from tilecast.loop import host_cost
from tilecast.loop.host_cost import HostCost, probe_key
from tilecast.perfmodel import load_machine
from tilecast.simulator.simulate import simulate


@pytest.fixture
def local(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    return load_machine("local").with_workers(2).with_task_overhead(2e-6)


def _probe(workers=2):
    probe = HostCost.fit(workers, [[10, 10, 0.01, 0.001], [100, 100, 0.02, 0.002], [300, 900, 0.05, 0.003]],
                         overheads=[[1000, 9e-6]])
    probe.probe_points = 3
    probe.task_overhead_s = 1e-6
    probe.gap_start_buffer_s, probe.gap_end_buffer_s, probe.gap_successor_s, probe.gap_ready_s = (1e-6, 2e-7, 6e-7,
                                                                                                   1e-6)
    return probe


def test_runs_refine_the_host_cost_but_keep_the_cost_between_tasks(local):
    probe = _probe()
    fits = host_cost.learn_from_runs({2: probe, probe_key(2, "dmda"): probe},
                                     [(2, "dmda", 500, 8700, 0.28, 0.29, 40e-6)])
    learned = fits["2:dmda"]
    assert len(learned.points) == 4  # the run taught the host cost
    # its mean start delay (40 us: its buffers and successors included) is not taken as the constant
    assert (learned.task_overhead_s, *learned.gap_costs) == (1e-6, 1e-6, 2e-7, 6e-7, 1e-6)
    host_cost.save_host_costs(local, fits)
    assert host_cost.load_host_costs(local)["2:dmda"].gap_costs == (1e-6, 2e-7, 6e-7, 1e-6)


def test_fits_of_the_format_before_are_measured_again(local):
    path = host_cost.save_host_costs(local, {2: _probe()})
    doc = json.load(open(path))
    doc["format"] = 7
    for h in doc["fits"].values():
        for k in ("gap_start_buffer_s", "gap_end_buffer_s", "gap_successor_s", "gap_ready_s"):
            del h[k]
    json.dump(doc, open(path, "w"))
    assert host_cost.load_host_costs(local) == {}


def test_predict_charges_the_cost_between_tasks(local):
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model
    from tilecast.loop.config import StepConfig
    from tilecast.loop.predict import predict

    probe = _probe()
    flat = HostCost(**{**probe.__dict__, "gap_start_buffer_s": 0.0, "gap_end_buffer_s": 0.0,
                       "gap_successor_s": 0.0, "gap_ready_s": 0.0})
    cfg = StepConfig(load_model("gpt2-tiny"), 2, 32, Tiling.parse("32"), "eager", 2)
    g = cfg.build()
    charged = predict(cfg, local, None, {2: probe}, graph=g)
    plain = predict(cfg, local, None, {2: flat}, graph=g)
    nbuf = np.diff(g.acc_ptr)
    # at least the per-buffer cost of every task, spread over the two workers
    assert charged.makespan_s - plain.makespan_s > 0.5 * 1e-6 * nbuf.sum() / 2 * 0.9


def test_the_ending_worker_pays_for_the_successors_it_releases():
    """On one worker, each task starts when the one before it ended plus what releasing that one's successors
    cost (StarPU's _starpu_handle_job_termination runs in the worker that ran the task)."""
    g = gemm_chain_graph(n_layers=2, tiles=2)
    d = np.full((1, g.n_tasks), 1e-4)
    m = cpu_machine(n_workers=1, overhead_us=0.0)
    free = simulate(g, m, "eager", durations=d)
    per_succ = 1e-5
    paid = simulate(g, m.with_gap_costs(0.0, 0.0, per_succ), "eager", durations=d)
    nsucc = np.bincount(g.dependencies[1], minlength=g.n_tasks)
    order = np.argsort(paid.start)
    # one worker: each task starts when the one before it ended plus that one's successors' cost
    gaps = paid.start[order[1:]] - paid.end[order[:-1]]
    assert gaps == pytest.approx(per_succ * nsucc[order[:-1]], abs=1e-12)
    assert paid.makespan == pytest.approx(free.makespan + per_succ * nsucc.sum() - per_succ * nsucc[order[-1]])


def test_the_rank_forecast_charges_the_mean_start_delay():
    """The rank loop charges no cost per buffer or successor: it gets the probes' mean start delay instead of
    the model's constant."""
    probe = _probe()
    assert probe.flat_task_overhead_s == pytest.approx(9e-6)
    flat = HostCost(**{**probe.__dict__, "gap_start_buffer_s": 0.0, "gap_end_buffer_s": 0.0,
                       "gap_successor_s": 0.0, "gap_ready_s": 0.0})
    assert flat.flat_task_overhead_s == 1e-6
