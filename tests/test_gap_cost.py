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
    probe.set_gap_costs((1e-6, 2e-7, 6e-7, 1e-6, 1.5e-6, 3e-12, 2.0**21))
    return probe


def test_runs_refine_the_host_cost_but_keep_the_cost_between_tasks(local):
    probe = _probe()
    fits = host_cost.learn_from_runs({2: probe, probe_key(2, "dmda"): probe},
                                     [(2, "dmda", 500, 8700, 0.28, 0.29, 40e-6)])
    learned = fits["2:dmda"]
    assert len(learned.points) == 4  # the run taught the host cost
    # its mean start delay (40 us: its buffers and successors included) is not taken as the constant
    assert (learned.task_overhead_s, *learned.gap_costs) == (1e-6, 1e-6, 2e-7, 6e-7, 1e-6, 1.5e-6, 3e-12, 2.0**21)
    host_cost.save_host_costs(local, fits)
    assert host_cost.load_host_costs(local)["2:dmda"].gap_costs == (1e-6, 2e-7, 6e-7, 1e-6, 1.5e-6, 3e-12, 2.0**21)


def test_fits_of_the_format_before_are_measured_again(local):
    path = host_cost.save_host_costs(local, {2: _probe()})
    doc = json.load(open(path))
    doc["format"] = 9
    for h in doc["fits"].values():
        del h["gap_handoff_s"]
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
                       "gap_successor_s": 0.0, "gap_ready_s": 0.0, "gap_handoff_s": 0.0, "gap_end_byte_s": 0.0})
    assert flat.flat_task_overhead_s == 1e-6


def _stages(n_stages: int, tile: int = 8):
    """Two fills, then ``n_stages`` stages of two GEMMs, each reading both tiles the stage before wrote."""
    from tilecast.graph import GraphBuilder, Tiling

    b = GraphBuilder(Tiling.uniform(tile))
    x = b.tensor("x0", (2 * tile, tile), ("seq", None), "activation")
    b.add("fill", [x.tile_ids([0, 1], 0)], dict(n=tile * tile, value=1.0))
    for k in range(1, n_stages + 1):
        y = b.tensor(f"x{k}", (2 * tile, tile), ("seq", None), "activation")
        beta, mode = b.accumulate(y.tile_ids([0, 1], 0))
        b.add("gemm", [x.tile_ids([0, 0], 0), x.tile_ids([1, 1], 0), y.tile_ids([0, 1], 0)],
              dict(trans_a=0, trans_b=0, m=tile, n=tile, k=tile, alpha=1.0, beta=beta), modes=[None, None, mode])
        x = y
    return b.build()


@pytest.mark.parametrize("native", [True, False])
def test_a_task_made_ready_on_the_other_worker_starts_later_by_the_handoff(native, monkeypatch):
    """Two workers, stages of two tasks that each need both tasks of the stage before: the task that ended last
    makes both ready, and one of them starts on the other worker, so each stage after the first waits one
    handoff more (StarPU's _starpu_handle_job_termination pushes it on one core, _starpu_fetch_task_input
    acquires its buffers on the other): the step is (stages + 1) x d + stages x handoff. On one worker nothing
    is handed over."""
    from tilecast.simulator.engine import Engine

    monkeypatch.setattr(Engine, "native_loop", native)
    n, d, h = 12, 1e-4, 7e-6
    g = _stages(n)
    durations = np.full((1, g.n_tasks), d)
    two = cpu_machine(n_workers=2, overhead_us=0.0)
    assert simulate(g, two, "eager", durations=durations).makespan == pytest.approx((n + 1) * d, rel=1e-12)
    handed = simulate(g, two.with_gap_costs(0.0, 0.0, 0.0, 0.0, h), "eager", durations=durations)
    assert handed.makespan == pytest.approx((n + 1) * d + n * h, rel=1e-12)
    one = cpu_machine(n_workers=1, overhead_us=0.0)
    alone = simulate(g, one.with_gap_costs(0.0, 0.0, 0.0, 0.0, h), "eager", durations=durations)
    assert alone.makespan == pytest.approx(2 * (n + 1) * d, rel=1e-12)


def test_the_ending_worker_pays_per_byte_of_its_task_up_to_the_cap():
    """After each task its worker pays the cost per byte of the tiles the task accessed, those beyond the cap
    not counted (tilecast.loop.gap_bytes)."""
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model
    from tilecast.loop.config import StepConfig
    from tilecast.perfmodel.reuse import task_bytes

    g = StepConfig(load_model("gpt2-tiny"), 2, 32, Tiling.parse("32"), "eager", 1).build()
    d = np.full((1, g.n_tasks), 1e-5)
    m = cpu_machine(n_workers=1, overhead_us=0.0)
    nbytes = task_bytes(g)
    cap = float(np.median(nbytes))
    assert nbytes.max() > cap > 0  # the cap cuts some tasks' bytes
    paid = simulate(g, m.with_gap_costs(0.0, 0.0, 0.0, 0.0, 0.0, 1e-10, cap), "eager", durations=d)
    order = np.argsort(paid.start)
    gaps = paid.start[order[1:]] - paid.end[order[:-1]]
    assert gaps == pytest.approx(1e-10 * np.minimum(nbytes[order[:-1]], cap), abs=1e-12)


def test_the_cost_per_byte_is_read_back_from_start_delays():
    """fit_end_byte_cost finds the cost per byte that a trace's start delays have beyond the gap model given:
    on a simulated trace whose worker paid it, the one it was simulated with (none where it paid none, and the
    same where every delay is longer by one constant)."""
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model
    from tilecast.loop.config import StepConfig
    from tilecast.loop.gap_bytes import fit_end_byte_cost

    g = StepConfig(load_model("gpt2-tiny"), 2, 32, Tiling.parse("32"), "eager", 1).build()  # tasks of many sizes
    d = np.random.default_rng(3).uniform(2e-5, 8e-5, size=(1, g.n_tasks))
    base = cpu_machine(n_workers=1, overhead_us=2.0).with_gap_costs(1e-7, 5e-8, 3e-7)
    coef = (2e-6, 1e-7, 5e-8, 3e-7, 0.0, 0.0)
    cap = 1e9
    paid = simulate(g, base.with_gap_costs(1e-7, 5e-8, 3e-7, 0.0, 0.0, 2e-11, cap), "eager", durations=d)
    assert fit_end_byte_cost([(g, paid.trace())], coef, cap) == pytest.approx(2e-11, rel=1e-6)
    free = simulate(g, base, "eager", durations=d)
    assert fit_end_byte_cost([(g, free.trace())], coef, cap) == pytest.approx(0.0, abs=1e-15)
    # every delay longer alike (a slower moment, a larger step): the constant takes it, not the bytes
    slower = simulate(g, base.with_task_overhead(3e-6).with_gap_costs(1e-7, 5e-8, 3e-7, 0.0, 0.0, 2e-11, cap),
                      "eager", durations=d)
    assert fit_end_byte_cost([(g, slower.trace())], coef, cap) == pytest.approx(2e-11, rel=1e-6)


def test_a_policy_measured_later_takes_its_worker_counts_cost_per_byte(monkeypatch):
    """A calibration that measures a scheduler's probes alone (its worker count's fits stored before) gives that
    scheduler's fit the cost per byte its worker count has, as the policies measured with it have, and before
    its decision costs are fitted by simulating its probes (fitted without it, they took up what predictions
    then charged again per byte)."""
    seen = []
    monkeypatch.setattr(host_cost, "fit_decisions",
                        lambda probe, *a: seen.append((probe.gap_end_byte_s, probe.gap_byte_cap)))
    monkeypatch.setattr(HostCost, "fit_gap_model", lambda self, traced: None)
    sessions = host_cost.ProbeSessions({2: _probe()}, [], [(2, "lws"), (2, "dmdasd")])
    assert host_cost.STEP_GAPS_KEY not in sessions.by_key  # no worker count measured: the step probe is not run
    for key in (probe_key(2, "lws"), probe_key(2, "dmdasd")):
        sessions.by_key[key].result = ([[10, 10, 0.01, 0.001], [100, 100, 0.02, 0.002]], [[1000, 9e-6]], [], 1e-6)
    fits, _ = sessions.fit(cpu_machine(n_workers=2), None)
    assert seen == [(3e-12, 2.0**21)]  # dmdasd's decisions fitted with it
    for sched in ("lws", "dmdasd"):
        assert (fits[probe_key(2, sched)].gap_end_byte_s, fits[probe_key(2, sched)].gap_byte_cap) == (3e-12, 2.0**21)
