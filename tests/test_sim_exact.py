"""Simulator on hand-computed cases: a chain, a fork-join, a transfer-bound pair on two memory nodes."""

import numpy as np
import pytest
from sim_machines import cpu_machine, two_device_machine

from tilecast.graph import GraphBuilder, Tiling
from tilecast.simulator.engine import Engine
from tilecast.simulator.links import Links
from tilecast.simulator.memory import Memory
from tilecast.simulator.policies.fixed import FixedInOrder
from tilecast.simulator.simulate import POLICIES, simulate

TILE = 256  # 256 x 256 float32 = 256 KiB per tile


def _builder():
    return GraphBuilder(Tiling.uniform(TILE))


def _tensor(b, name, kind, n=1):
    return b.tensor(name, (n * TILE, TILE), ("seq", None), kind)


def _axpy(b, x, y):
    b.add("axpy", [x, y], dict(n=TILE * TILE, alpha=1.0))


def chain_graph():
    b = _builder()
    x, y = _tensor(b, "x", "param"), _tensor(b, "y", "param")
    for _ in range(3):
        _axpy(b, x.tile_ids(0, 0), y.tile_ids(0, 0))
    return b.build()


def fork_join_graph():
    b = _builder()
    a, s = _tensor(b, "a", "activation"), _tensor(b, "s", "param", 3)
    b.add("fill", [a.tile_ids(0, 0)], dict(n=TILE * TILE, value=1.0))  # 0: fork source
    _axpy(b, a.tile_ids(0, 0), s.tile_ids(0, 0))  # 1
    _axpy(b, a.tile_ids(0, 0), s.tile_ids(1, 0))  # 2
    b.add("gemm", [s.tile_ids(0, 0), s.tile_ids(1, 0), s.tile_ids(2, 0)],  # 3: join
          dict(trans_a=0, trans_b=0, m=TILE, n=TILE, k=TILE, alpha=1.0, beta=1.0))
    return b.build()


@pytest.mark.parametrize("sched", list(POLICIES))
def test_chain_runs_back_to_back_with_the_overhead(sched):
    g = chain_graph()
    m = cpu_machine(n_workers=2, overhead_us=0.5e6)  # 0.5 s per task
    r = simulate(g, m, sched, durations=np.array([[1.0, 2.0, 3.0]]))
    np.testing.assert_allclose(r.start, [0.5, 2.0, 4.5])
    np.testing.assert_allclose(r.end, [1.5, 4.0, 7.5])
    assert r.makespan == pytest.approx(7.5)
    assert r.summary["critical_path_s"] == pytest.approx(7.5)


@pytest.mark.parametrize("sched", [s for s in POLICIES if s != "random"])  # random may stack both branches
def test_fork_join_on_two_workers(sched):
    g = fork_join_graph()
    assert [g.predecessors(i).tolist() for i in range(4)] == [[], [0], [0], [1, 2]]
    r = simulate(g, cpu_machine(n_workers=2), sched, durations=np.array([[1.0, 2.0, 4.0, 1.0]]))
    np.testing.assert_allclose(r.start, [0.0, 1.0, 1.0, 5.0])
    assert r.makespan == pytest.approx(6.0)
    assert r.worker[1] != r.worker[2]  # the two branches ran side by side
    assert r.summary["critical_path_s"] == pytest.approx(6.0)
    assert r.summary["work_bound_s"] == pytest.approx(4.0)


def transfer_pair_graph():
    b = _builder()
    x, y = _tensor(b, "x", "activation"), _tensor(b, "y", "param")
    b.add("fill", [x.tile_ids(0, 0)], dict(n=TILE * TILE, value=1.0))  # 0: writes X on its node
    _axpy(b, x.tile_ids(0, 0), y.tile_ids(0, 0))  # 1: reads X, updates Y (Y starts in host memory)
    return b.build()


def test_transfer_bound_pair_on_two_memory_nodes():
    g = transfer_pair_graph()
    m = two_device_machine(bw_gbps=1.0, lat_us=10.0)  # device-device: 2 hops of 5 us; host-device: 10 us
    links = Links(m)
    mem = Memory(g, m, links)
    dur = np.array([[1e-3, 1e-3]])
    eng = Engine(dur, *g.dependencies, [0, 0], [1, 2], FixedInOrder([0, 1]), memory=mem).run()
    nbytes = TILE * TILE * 4
    move = 10e-6 + nbytes / 1e9  # both copies take latency + bytes / bandwidth, on different links
    assert eng.start[0] == pytest.approx(0.0)  # a first write needs no transfer
    assert eng.start[1] == pytest.approx(1e-3 + move)
    assert eng.end[1] == pytest.approx(2e-3 + move)
    assert sorted((src, dst, b) for src, dst, b, _, _ in links.log) == [(0, 2, nbytes), (1, 2, nbytes)]
    per_link = {m.links[i].name: int(b) for i, b in enumerate(links.bytes_per_link()) if b}
    assert per_link == {"pcie:host->dev1": nbytes, "p2p:dev0->sw": nbytes, "p2p:sw->dev1": nbytes}
    assert mem.valid[g.tensor("y").first_tile] == 1 << 2  # the write left one valid copy, on device 2


def test_transfers_on_one_link_are_serialized():
    m = two_device_machine(bw_gbps=1.0, lat_us=10.0)
    links = Links(m)
    first = links.transfer(0, 1, 10**6, 0.0)
    second = links.transfer(0, 1, 10**6, 0.0)
    other = links.transfer(0, 2, 10**6, 0.0)
    assert first == pytest.approx(10e-6 + 1e-3)
    assert second == pytest.approx(2 * first)  # waited for the first on the same link
    assert other == pytest.approx(first)  # another link: in parallel


def test_dmda_places_the_reader_next_to_its_data_and_dm_does_not_count_transfers():
    g = transfer_pair_graph()
    m = two_device_machine(bw_gbps=1.0, lat_us=10.0)
    dur = np.array([[1e-3, 1e-3]])
    dmda = simulate(g, m, "dmda", durations=dur)
    assert dmda.worker[1] == dmda.worker[0]
    assert dmda.summary["bytes_moved"] == TILE * TILE * 4  # only Y came from the host
    eager = simulate(g, m, "eager", durations=dur)
    assert dmda.makespan <= eager.makespan


def test_small_device_memory_evicts_and_writes_back_dirty_tiles():
    b = _builder()
    acts = _tensor(b, "act", "activation", 6)
    for i in range(6):  # six tiles written on one device that holds three
        b.add("fill", [acts.tile_ids(i, 0)], dict(n=TILE * TILE, value=1.0))
    g = b.build()
    cap_gib = 3 * TILE * TILE * 4 / 2**30
    m = two_device_machine(capacity_gib=cap_gib, n_devices=1)
    r = simulate(g, m, "dmda", durations=np.full((1, 6), 1e-3))
    assert r.summary["peak_memory_bytes"]["dev0"] <= 3 * TILE * TILE * 4
    assert r.summary["evictions"] == 3 and r.summary["writebacks"] == 3
    assert r.summary["bytes_per_link"] == {"pcie:dev0->host": 3 * TILE * TILE * 4}


def _two_readers_graph():
    b = _builder()
    p, acc = _tensor(b, "p", "param", 2), _tensor(b, "acc", "activation", 2)
    for i in range(2):  # two independent tasks, each reading its own host tile
        b.add("fill", [acc.tile_ids(i, 0)], dict(n=TILE * TILE, value=0.0))
        _axpy(b, p.tile_ids(i, 0), acc.tile_ids(i, 0))
    return b.build()


def test_dmda_prefetches_while_the_worker_is_busy_and_eager_fetches_on_demand():
    g = _two_readers_graph()
    m = two_device_machine(bw_gbps=1.0, lat_us=10.0, n_devices=1)
    move = 10e-6 + TILE * TILE * 4 / 1e9
    dur = np.full((1, 4), 1e-3)
    dmda, eager = simulate(g, m, "dmda", durations=dur), simulate(g, m, "eager", durations=dur)
    # Order on the one worker: fill0, fill1, axpy0, axpy1. dmda assigns axpy_i when fill_i
    # ends and copies its input at once, while the worker runs the next task: no copy is
    # exposed. Under eager a copy starts only when the worker takes the axpy.
    assert dmda.transfers["start"].tolist() == pytest.approx([1e-3, 2e-3])
    assert dmda.makespan == pytest.approx(4e-3)
    assert eager.transfers["start"].tolist() == pytest.approx([2e-3, 3e-3 + move])
    assert eager.makespan == pytest.approx(4e-3 + 2 * move)


def test_heterogeneous_workers_dm_uses_the_faster_kind():
    g = chain_graph()
    m = two_device_machine(n_devices=1, host_workers=1)
    assert m.kind_names == ["acc", "cpu"]
    dur = np.array([[1e-3] * 3, [1e-1] * 3])  # the device is 100x faster
    r = simulate(g, m, "dm", durations=dur)
    assert r.worker.tolist() == [0, 0, 0]
    slow = simulate(g, m, "dm", durations=dur[::-1].copy())
    assert slow.worker.tolist() == [1, 1, 1]


def test_a_task_larger_than_device_memory_is_reported():
    from tilecast.simulator import SimulationError

    g = transfer_pair_graph()
    m = two_device_machine(capacity_gib=TILE * TILE * 4 / 2**30, n_devices=1)  # room for one of two tiles
    with pytest.raises(SimulationError, match="cannot hold the data"):
        simulate(g, m, "dmda", durations=np.full((1, 2), 1e-3))


def test_a_shared_uplink_serializes_copies_to_two_devices():
    from sim_machines import KIND, fig

    from tilecast.perfmodel import parse_machine

    m = parse_machine({
        "format": 1, "name": "switched",
        "memory_nodes": [{"name": "host", "kind": "ram", "capacity_GiB": fig(64)},
                         {"name": "dev", "kind": "hbm", "count": 2, "capacity_GiB": fig(1)}],
        "switches": ["pcisw"],
        "links": [{"name": "uplink", "between": ["host", "pcisw"], "bandwidth_GBps": fig(1.0), "latency_us": fig(0)},
                  {"name": "down", "between": ["pcisw", "dev"], "bandwidth_GBps": fig(1.0), "latency_us": fig(0)}],
        "worker_kinds": {"acc": KIND},
        "workers": [{"name": "w", "kind": "acc", "count": 2, "memory_node": "dev"}],
    })
    assert [m.links[i].name for i in m.routes[0][2]] == ["uplink:host->pcisw", "down:pcisw->dev1"]
    links = Links(m)
    a = links.transfer(0, 1, 10**6, 0.0)
    b = links.transfer(0, 2, 10**6, 0.0)
    assert a == pytest.approx(1e-3) and b == pytest.approx(2e-3)  # the uplink carried one, then the other


def test_durations_for_another_graph_are_refused():
    g = transfer_pair_graph()
    with pytest.raises(ValueError, match=r"durations: shape \(1, 3\), expected"):
        simulate(g, two_device_machine(), "dmda", durations=np.full((1, 3), 1e-3))
