"""tilecast tune: candidates, ranking by simulation, choice of what to execute, host-cost fit."""

import json

import numpy as np
import pytest

from tilecast.cli import main
from tilecast.graph.model_config import load_model
from tilecast.loop import pick_for_execution, tune
from tilecast.loop.candidates import candidate_tilings, dims_of, effective
from tilecast.loop.host_cost import HostCost
from tilecast.loop.kernel_calibration import missing_cases

from loop_home import loop_home, loop_home_dir  # noqa: F401


def test_candidate_tilings_are_distinct_and_end_untiled():
    cfg = load_model("gpt2-tiny")
    tilings = candidate_tilings(cfg, 4, 64)
    dims = dims_of(cfg, 4, 64)
    keys = [effective(t, dims) for t in tilings]
    assert len(set(keys)) == len(keys) >= 3
    assert keys[-1] == tuple(dims[d] for d in ("batch", "seq", "embd", "head", "inner", "vocab"))


def test_tune_ranks_fastest_prediction_first_and_caches_calibration(loop_home):  # noqa: F811
    cfg = load_model("gpt2-tiny")
    res = tune(cfg, 2, 32, scheds=("eager", "dmda"), workers=[1, 2], progress=False)
    times = [p.step_s for p in res.ranking]
    assert res.ranking[0].step_s == min(times)
    assert times == sorted(times)
    assert len(res.ranking) == 2 * 2 * len(res.graphs)
    assert {p.config.sched for p in res.ranking} == {"eager", "dmda"}
    for p in res.ranking:
        g = res.graphs[p.config.tiling.describe()]
        assert p.tasks == g.n_tasks and p.fits
        assert sum(p.peak_memory_bytes.values()) == int(g.tile_nbytes.sum())
        assert p.step_s == pytest.approx(p.makespan_s + p.host_s)
    # first use calibrated every shape of the candidates and stored them: nothing is left to time
    assert missing_cases(res.calibration, res.graphs.values()) == []
    assert list((loop_home / "calibration").glob("local-*.json"))
    if res.host_costs:  # StarPU present: its per-step cost was measured for both worker counts
        assert {1, 2} <= set(res.host_costs)
        assert all(p.host_s > 0 for p in res.ranking)


def test_simulate_predicts_the_step_time_that_tune_predicts(loop_home, capsys):  # noqa: F811
    from tilecast.graph import Tiling

    res = tune(load_model("gpt2-tiny"), 2, 32, scheds=("eager", "dmda"), workers=[1], tilings=[Tiling.parse("32")],
               progress=False)
    assert len(res.ranking) == 2
    for p in res.ranking:
        assert main(["simulate", "--model", "gpt2-tiny", "--batch", "2", "--seq", "32", "--tile", "32",
                     "--sched", p.config.sched, "--workers", "1", "--no-trace", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["step_s"] == pytest.approx(p.step_s, rel=1e-12)
        assert doc["makespan_s"] == pytest.approx(p.makespan_s, rel=1e-12)
        assert doc["host_s"] == pytest.approx(p.host_s, rel=1e-12, abs=1e-15)
        assert doc["host_known"] == bool(res.host_costs) == p.host_known
        assert doc["task_overhead_us"] == pytest.approx(p.task_overhead_s * 1e6)
        # and what accuracy predicts for the configuration alone (durations for its worker count)
        from tilecast.loop.predict import predict, stored_models
        from tilecast.perfmodel import load_machine

        machine = load_machine("local")
        assert predict(p.config, machine, *stored_models(machine)).step_s == pytest.approx(p.step_s, rel=1e-12)


def test_tune_cli_json_and_bad_input(loop_home, capsys):  # noqa: F811
    argv = ["tune", "--model", "gpt2-tiny", "--batch", "2", "--seq", "32", "--scheds", "eager", "--workers", "1",
            "--tiles", "64;256"]
    assert main(argv + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["tiling"] for r in doc["ranking"]].count("batch=64,seq=64,embd=64,head=64,inner=64,vocab=64") == 1
    assert doc["ranking"][0]["pred_step_s"] <= doc["ranking"][1]["pred_step_s"]
    assert main(argv[:-4] + ["--scheds", "fastest"]) == 2
    assert "--scheds" in capsys.readouterr().err
    assert main(argv + ["--workers", "0"]) == 2
    assert main(["tune", "--machine", "h100-sxm5-80gb-8", "--execute", "1"]) == 2


class _P:
    def __init__(self, i, fits=True):
        self.i, self.fits = i, fits


def test_pick_for_execution_takes_the_best_and_spreads_the_rest():
    ranking = [_P(i) for i in range(10)] + [_P(10, fits=False)]
    chosen = [p.i for p in pick_for_execution(ranking, 3, 2)]
    assert chosen[:3] == [0, 1, 2]
    assert chosen[3:] == [6, 9]  # middle and last of the fitting rest; never one over capacity
    assert [p.i for p in pick_for_execution(ranking[:2], 3, 2)] == [0, 1]


def test_host_cost_fit_recovers_a_linear_cost():
    rng = np.random.default_rng(1)
    pts = [[t, n, mk, 0.004 + 2e-5 * t + 7e-6 * n]
           for (t, n), mk in zip(rng.integers(100, 20_000, size=(8, 2)), rng.uniform(0.001, 2.0, size=8))]
    h = HostCost.fit(2, pts, overheads=[[1000, 2e-6], [3000, 4e-6]])
    assert h.fixed_s == pytest.approx(0.004, rel=1e-6)
    assert h.per_tile_s == pytest.approx(2e-5, rel=1e-6)
    assert h.per_task_s == pytest.approx(7e-6, rel=1e-6)
    assert h.seconds(1000, 2000) == pytest.approx(0.004 + 0.02 + 0.014)
    assert h.task_overhead_s == pytest.approx(3.5e-6)  # weighted by the task rate
    assert HostCost.fit(2, pts).task_overhead_s is None


def test_host_cost_fits_are_stored_per_scheduler_and_dropped_when_the_executor_changes(tmp_path, monkeypatch):
    from tilecast.loop import host_cost
    from tilecast.perfmodel import load_machine

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    machine = load_machine("local")
    probes = HostCost.fit(2, [[100, 100, 0.001, 0.01], [1000, 2000, 0.002, 0.03], [3000, 9000, 0.004, 0.09]])
    probes = HostCost.fit(2, probes.points, overheads=[[100, 2e-6]])
    fits = host_cost.learn_from_runs({2: probes}, [(2, "dmda", 500, 700, 0.5, 0.55, 5e-6),
                                                   (2, "dmda", 50, 40, 1.0, 1.1, 8e-6)])
    assert host_cost.host_cost_for(fits, 2, "dmda") is fits["2:dmda"]
    assert host_cost.host_cost_for(fits, 2, "eager") is probes  # no runs of eager: the probe fit
    assert len(fits["2:dmda"].points) == 3 + 2 and fits["2:dmda"].probe_points == 3
    # with enough runs of its own, a scheduler's fit leaves the (eager) probe points out
    more = host_cost.learn_from_runs(fits, [(2, "dmda", 100 * i, 90 * i, 0.1 * i, 0.1 * i + 0.001, 5e-6)
                                             for i in range(1, 3)])
    assert more["2:dmda"].probe_points == 0 and len(more["2:dmda"].points) == 2 + 2
    # the scheduler's cost per task comes from its own runs only, weighted by their tasks per second
    rate = [700 / 0.55, 40 / 1.1]
    assert fits["2:dmda"].task_overhead_s == pytest.approx((rate[0] * 5e-6 + rate[1] * 8e-6) / sum(rate))
    assert probes.task_overhead_s == pytest.approx(2e-6)
    host_cost.save_host_costs(machine, fits)
    back = host_cost.load_host_costs(machine)
    assert set(back) == {2, "2:dmda"} and back[2].per_task_s == pytest.approx(probes.per_task_s)
    monkeypatch.setattr(host_cost, "executor_fingerprint", lambda: "another executor")
    assert host_cost.load_host_costs(machine) == {}


def test_sessions_of_short_configurations_are_interleaved():
    from tilecast.loop.execute import SHORT_ROUNDS, rounds_for, session_order, steps_for
    from tilecast.loop.measure import split_steps

    assert split_steps(29, 5) == [6, 6, 6, 6, 5] and split_steps(2, 5) == [1, 1]
    plans = [split_steps(steps_for(t, 5), rounds_for(t, steps_for(t, 5))) for t in (0.04, 3.0, 0.05, 2.0, 4.0)]
    n = SHORT_ROUNDS
    assert [len(p) for p in plans] == [n, 1, n, 1, 1]  # short steps over several sessions, long ones in one
    order = session_order(plans)
    assert sorted(order) == [(i, k) for i, p in enumerate(plans) for k in range(len(p))]
    # block b: session b of each short configuration, then a share of the long ones, spread over the blocks
    assert order[:2] == [(0, 0), (2, 0)] and order[-2:] == [(2, n - 1), (4, 0)]
    long_at = [order.index((i, 0)) for i in (1, 3, 4)]
    assert long_at == sorted(long_at) and long_at[0] > 2 and long_at[-1] == len(order) - 1
    assert session_order([[3], [4]]) == [(0, 0), (1, 0)]


def test_long_configurations_run_in_two_sessions_where_asked_with_two_steps_each():
    """The accuracy suite measures a configuration of long steps in LONG_ROUNDS sessions (one session is one
    sample of where the threads and tiles landed), each of at least 2 timed steps; short ones as before."""
    from tilecast.loop.accuracy import LONG_ROUNDS
    from tilecast.loop.execute import SHORT_ROUNDS, rounds_for, session_order
    from tilecast.loop.measure import split_steps

    assert LONG_ROUNDS == 2
    assert [rounds_for(2.0, n, LONG_ROUNDS) for n in (1, 3, 4, 5)] == [1, 1, 2, 2]
    assert rounds_for(2.0, 4) == 1  # tune and run keep one session
    assert rounds_for(0.04, 40, LONG_ROUNDS) == SHORT_ROUNDS
    plans = [split_steps(4, rounds_for(t, 4, LONG_ROUNDS)) for t in (3.0, 2.0)]
    assert plans == [[2, 2], [2, 2]]
    order = session_order(plans)  # each configuration's two sessions apart, the other's between them
    assert order == [(0, 0), (1, 0), (0, 1), (1, 1)]
