"""The forecast on StarPU-MPI ranks: pinned tasks, StarPU-MPI's messages, the one-node simulator at 1 rank."""

import json

import numpy as np
import pytest

from tests.sim_machines import KIND, fig
from tilecast.cli import main
from tilecast.graph import Tiling
from tilecast.graph.distribution import prepare
from tilecast.graph.model_config import load_model
from tilecast.graph.models import build_step
from tilecast.graph.owner_computes import rank_figures
from tilecast.perfmodel import parse_machine
from tilecast.simulator.engine import Engine
from tilecast.simulator.ranks import simulate_ranks
from tilecast.perfmodel.network import Network, fit_network, load_network, save_network
from tilecast.simulator.simulate import simulate

CFG = '{"n_layer":3,"n_embd":32,"n_head":2,"vocab_size":64,"n_positions":32}'
NET = Network(latency_s=20e-6, bandwidth_Bps=1e9, message_s=30e-6)


def cpu_machine(workers=2, overhead_us=2.0):
    doc = {"format": 1, "name": "test-cpu", "runtime": {"task_overhead_us": fig(overhead_us)},
           "memory_nodes": [{"name": "host", "kind": "ram", "capacity_GiB": fig(64)}],
           "links": [], "worker_kinds": {"cpu": KIND},
           "workers": [{"name": "cpu", "kind": "cpu", "count": workers, "memory_node": "host"}]}
    return parse_machine(doc, where="test")


@pytest.fixture(scope="module")
def graph():
    return build_step(load_model(CFG), 4, 16, Tiling.parse("16,batch=1"))


def durations(graph, seed=0):
    rng = np.random.default_rng(seed)
    return (1e-6 + graph.flops[None, :] * 1e-10) * rng.uniform(0.5, 1.5, size=(1, graph.n_tasks))


@pytest.mark.parametrize("dist,ranks", [("data", 2), ("layer", 3), ("cyclic", 4)])
def test_messages_are_owner_computes(graph, dist, ranks):
    g, d = prepare(graph, ranks, dist)
    res = simulate_ranks(g, d, cpu_machine(1), NET, "lws", 1, durations=durations(g))
    fig_ = rank_figures(g, d)
    m = res.messages
    assert res.summary["bytes_moved"] == fig_["bytes_moved"] == int(m["bytes"].sum()) > 0
    assert res.summary["messages"] == fig_["messages"]
    got = np.zeros((ranks, ranks), dtype=np.int64)
    np.add.at(got, (m["src"], m["dst"]), m["bytes"])
    assert got.tolist() == fig_["bytes_matrix"]
    # each message leaves after the last write of its tile on the sender and arrives before its task starts
    assert np.all(res.start[m["task"]] >= m["end"] - 1e-12)
    assert np.all(m["end"] - m["start"] >= NET.seconds(m["bytes"]) - 1e-12)
    assert res.makespan >= max(res.end.max(), m["end"].max()) - 1e-12


@pytest.mark.parametrize("sched", ["lws", "ws", "dmda", "dmdas", "eager", "prio", "random"])
def test_pinned_tasks_run_on_their_ranks_workers(graph, sched):
    g, d = prepare(graph, 2, "data")
    res = simulate_ranks(g, d, cpu_machine(2), NET, sched, 2, durations=durations(g))
    assert np.all(res.worker // 2 == res.task_rank)
    assert set(np.unique(res.worker).tolist()) == {0, 1, 2, 3}  # every worker of both ranks gets work
    # a worker runs one task at a time
    for w in range(4):
        sel = np.flatnonzero(res.worker == w)
        o = np.argsort(res.start[sel])
        assert np.all(res.start[sel][o][1:] >= res.end[sel][o][:-1] - 1e-12)


@pytest.mark.parametrize("sched", ["lws", "dmda", "prio"])
def test_one_rank_is_the_one_node_simulator(graph, sched, monkeypatch):
    g, d = prepare(graph, 1, "layer")
    m = cpu_machine(2)
    dur = durations(g)
    res = simulate_ranks(g, d, m, NET, sched, 2, durations=dur)
    monkeypatch.setattr(Engine, "native_loop", False)
    monkeypatch.setattr(Engine, "fused_loops", False)
    one = simulate(g, m, sched, durations=dur)
    assert res.summary["messages"] == 0
    assert res.makespan == pytest.approx(one.makespan, rel=1e-12)
    assert np.allclose(res.start, one.start) and np.array_equal(res.worker, one.worker)


def test_a_slower_network_slows_the_step(graph):
    g, d = prepare(graph, 2, "layer")
    fast = simulate_ranks(g, d, cpu_machine(1), NET, "lws", 1, durations=durations(g))
    slow = simulate_ranks(g, d, cpu_machine(1), Network(latency_s=2e-3, bandwidth_Bps=1e8), "lws", 1,
                          durations=durations(g))
    assert slow.makespan > fast.makespan + 2e-3


def test_network_fit_and_store(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    sizes = np.array([8, 1024, 65536, 1 << 20])
    net = fit_network(sizes, 50e-6 + sizes / 2e9, 10e-6 + sizes / 5e9, transport="t", ranks=2)
    assert net.latency_s == pytest.approx(10e-6) and net.message_s == pytest.approx(40e-6)
    assert net.bandwidth_Bps == pytest.approx(2e9, rel=1e-6)
    m = cpu_machine(2)
    save_network(m, net)
    back = load_network(m, 2, 1)
    assert back.message_s == pytest.approx(net.message_s) and back.transport == "t"
    assert load_network(m, 2, 2) is None
    assert load_network(m, 4, 1).ranks == 2  # the 2-rank fit serves other rank counts
    with pytest.raises(ValueError, match="bandwidth_Bps"):
        Network(latency_s=0.0, bandwidth_Bps=0.0)


def test_simulate_ranks_cli(capsys):
    base = ["simulate", "--model", CFG, "--batch", "4", "--seq", "16", "--tile", "16,batch=1", "--network",
            "20,30,1", "--json"]
    assert main(base + ["--ranks", "2", "--distribution", "layer"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ranks"] == 2 and out["messages"] > 0 and out["pred_step_s"] > 0
    assert sum(r["bytes_sent"] for r in out["per_rank"]) == out["bytes_moved"]
    assert main(base + ["--ranks", "4", "--distribution", "layer"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tilecast simulate: --ranks: the layer distribution needs a layer")
    assert main(base + ["--ranks", "2", "--distribution", "data", "--batch", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--ranks: the data distribution needs a batch tile per rank" in err[0]


def test_tune_ranks_ranks_distributions(capsys):
    assert main(["tune", "--model", CFG, "--batch", "4", "--seq", "16", "--tiles", "16,batch=1;32,batch=1",
                 "--ranks", "2", "--scheds", "lws", "--network", "20,30,1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {r["distribution"] for r in out["ranking"]} == {"data", "layer", "cyclic"}
    steps = [r["pred_step_s"] for r in out["ranking"]]
    assert steps == sorted(steps) and len(steps) == 6


def test_message_cost_fitted_on_a_probe_step(graph):
    from tilecast.loop.ranks_probe import fit_message_cost

    g, d = prepare(graph, 2, "layer")

    def predict(cost):
        net = Network(latency_s=NET.latency_s, bandwidth_Bps=NET.bandwidth_Bps, message_s=cost)
        return simulate_ranks(g, d, cpu_machine(1), net, "lws", 1, durations=durations(g)).makespan

    target = predict(2e-3)
    cost = fit_message_cost(target, predict, low=NET.message_s)
    assert cost == pytest.approx(2e-3, rel=0.01)
    assert fit_message_cost(predict(NET.message_s) / 2, predict, low=NET.message_s) == NET.message_s


def test_network_fit_falls_back_to_mpi_bandwidth():
    sizes = np.array([8, 1024, 8192, 1 << 20])
    disturbed = np.array([6e-3, 7e-3, 4e-3, 1e-4])  # slow small sizes: a burst of other work
    net = fit_network(sizes, disturbed, 1e-6 + sizes / 1e10)
    assert net.bandwidth_Bps == pytest.approx(1e10, rel=1e-6)


def test_a_ranks_policy_charges_its_own_workers():
    """A rank's policy numbers its workers from 0; what it charges a worker (a sorted insertion's walk, a
    decision) goes to that worker's global id in the engine, not to the first rank's worker of that number."""
    from types import SimpleNamespace

    from tilecast.simulator.ranks_policy import RankView

    charged = []
    engine = SimpleNamespace(n_tasks=0, worker_kind=[0, 0, 0, 0], duration=None, duration_array=None, env=None,
                             missing=[], walk=lambda by, k: charged.append(("walk", by, k)),
                             decide=lambda locked, scanned, by=-1, serial=True: charged.append(("decide", by, scanned)))
    view = RankView(engine, [2, 3])
    view.walk(1, 7)
    view.walk(-1, 4)
    view.decide(1, 9, 0)
    view.decide(1, 5)
    assert charged == [("walk", 3, 7), ("walk", -1, 4), ("decide", 2, 9), ("decide", -1, 5)]
