"""The rank simulator's threads: time slices on shared cores, the progress thread's polls, shared interfaces."""

import numpy as np
import pytest

from tests.test_rank_simulator import cpu_machine, durations
from tilecast.executor.mpi_threads import progress_drives_worker, runnable_threads
from tilecast.graph import Tiling
from tilecast.graph.distribution import prepare
from tilecast.graph.model_config import load_model
from tilecast.graph.models import build_step
from tilecast.perfmodel.network import Network
from tilecast.simulator.ranks import simulate_ranks
from tilecast.graph import GraphBuilder
from tilecast.graph.distribution import Distribution
from tilecast.simulator.ranks_threads import CoreSharing, default_slice_s, tick_slice_s

CFG = '{"n_layer":2,"n_embd":32,"n_head":2,"vocab_size":64,"n_positions":32}'
NO_LATENCY = Network(latency_s=0.0, bandwidth_Bps=1e7, message_s=0.0)  # every message longer than a task's cost


@pytest.fixture(scope="module")
def graph():
    return build_step(load_model(CFG), 4, 16, Tiling.parse("16,batch=1"))


def test_time_slices():
    # 2 ranks x (1 worker + its progress thread) on 1 core, slices of 1 ms: a period of 4 ms, one slice each
    sh = CoreSharing(cores=1, ranks=2, workers_per_rank=1, progress_drives_worker=False, slice_s=1e-3)
    assert sh.threads == 4 and sh.period == pytest.approx(4e-3) and sh.core_share == pytest.approx(4.0)
    assert sh.worker_thread(1, 0) == 2 and sh.progress_thread(1) == 3
    assert sh.next_on(1, 0.5e-3) == pytest.approx(1e-3) and sh.next_on(1, 1.5e-3) == pytest.approx(1.5e-3)
    assert sh.finish(0, 0.5e-3, 0.25e-3) == pytest.approx(0.75e-3)  # fits in its slice
    assert sh.finish(0, 0.5e-3, 1e-3) == pytest.approx(4.5e-3)  # half now, half in the next period
    assert sh.finish(2, 0.0, 2.5e-3) == pytest.approx(10.5e-3)  # slices 2-3, 6-7, then half of 10-11
    # background threads lengthen the period; with a core per thread nothing waits
    assert CoreSharing(2, 2, 1, True, background=2, slice_s=1e-3).period == pytest.approx(2e-3)
    free = CoreSharing(cores=8, ranks=2, workers_per_rank=1, progress_drives_worker=False)
    assert not free.shared and free.next_on(3, 1.234) == 1.234 and free.finish(3, 1.0, 0.5) == 1.5
    assert default_slice_s(2) == pytest.approx(1.5e-3) and default_slice_s(1) == pytest.approx(0.75e-3)
    with pytest.raises(ValueError, match="background"):
        CoreSharing(2, 2, 1, True, background=-1)


def test_progress_thread_rule():
    assert progress_drives_worker(2, 1, 2) and not progress_drives_worker(1, 1, 2)
    assert not progress_drives_worker(2, 1, 16) and not progress_drives_worker(2, 1, None)
    assert runnable_threads(1, True) == 1 and runnable_threads(2, False) == 3


def test_threaded_engine_without_sharing_is_the_plain_one(graph):
    # no latency and no cost per message (the plain engine holds the link for them, this one does not), a
    # core per thread, a link per pair: the same step to the last task
    g, d = prepare(graph, 2, "layer")
    dur = durations(g)
    plain = simulate_ranks(g, d, cpu_machine(1), NO_LATENCY, "lws", 1, durations=dur)
    free = CoreSharing(cores=64, ranks=2, workers_per_rank=1, progress_drives_worker=False)
    threaded = simulate_ranks(g, d, cpu_machine(1), NO_LATENCY, "lws", 1, durations=dur, sharing=free, nic="pair")
    assert threaded.makespan == pytest.approx(plain.makespan, rel=1e-9)
    assert np.allclose(threaded.start, plain.start) and np.array_equal(threaded.worker, plain.worker)


def test_shared_cores_stretch_kernels_and_delay_messages(graph):
    g, d = prepare(graph, 2, "layer")
    dur = durations(g) * 50  # tasks of tens of microseconds to a few milliseconds
    net = Network(latency_s=10e-6, bandwidth_Bps=1e9, message_s=20e-6)
    free = CoreSharing(cores=64, ranks=2, workers_per_rank=1, progress_drives_worker=False)
    shared = CoreSharing(cores=2, ranks=2, workers_per_rank=1, progress_drives_worker=False, slice_s=1e-3)
    a = simulate_ranks(g, d, cpu_machine(1), net, "lws", 1, durations=dur, sharing=free, nic="node")
    b = simulate_ranks(g, d, cpu_machine(1), net, "lws", 1, durations=dur, sharing=shared, nic="node")
    # a task's wall time is its duration where it fits in a slice, longer where it waits for the next one:
    # on average the share (4 threads on 2 cores: 2x)
    wall = b.end - b.start
    assert np.all(wall >= dur[0] - 1e-12)
    assert wall.sum() / dur.sum() == pytest.approx(shared.core_share, rel=0.15)
    assert b.makespan > 1.5 * a.makespan
    # a message is received no earlier than the receiving progress thread is on a core
    m = b.messages
    for dst, end in zip(m["dst"], m["end"]):
        assert shared.next_on(shared.progress_thread(int(dst)), end - 1e-9) <= end + 1e-9


def test_progress_thread_running_worker_0_polls_between_tasks(graph):
    g, d = prepare(graph, 2, "layer")
    dur = durations(g) * 50
    net = Network(latency_s=10e-6, bandwidth_Bps=1e9, message_s=20e-6)
    drives = CoreSharing(cores=64, ranks=2, workers_per_rank=1, progress_drives_worker=True)
    res = simulate_ranks(g, d, cpu_machine(1), net, "lws", 1, durations=dur, sharing=drives, nic="node")
    m = res.messages
    # no message is received while its receiver's worker 0 runs a task: it waits for the task's end
    for dst, end in zip(m["dst"], m["end"]):
        on = res.task_rank == dst
        running = (res.start[on] < end - 1e-12) & (res.end[on] > end + 1e-12)
        assert not running.any()


def test_messages_share_each_ranks_interfaces(graph):
    g, d = prepare(graph, 4, "cyclic")
    net = Network(latency_s=10e-6, bandwidth_Bps=2e8, message_s=30e-6)
    res = simulate_ranks(g, d, cpu_machine(1), net, "lws", 1, durations=durations(g), nic="node")
    m = res.messages
    wire = m["start"] - cpu_machine(1).task_overhead  # when each message takes the wire
    hold = m["bytes"] / net.bandwidth_Bps  # the per-message cost is in flight, not held
    for side in ("src", "dst"):  # one message at a time on each rank's outgoing and incoming interface
        for r in range(4):
            sel = np.flatnonzero(m[side] == r)
            o = sel[np.argsort(wire[sel], kind="stable")]
            assert np.all(wire[o][1:] >= wire[o][:-1] + hold[o][:-1] - 1e-12)
    pair = simulate_ranks(g, d, cpu_machine(1), net, "lws", 1, durations=durations(g), nic="pair")
    assert res.summary["bytes_moved"] == pair.summary["bytes_moved"] and res.summary["nic"] == "node"


def test_slices_last_whole_ticks():
    # the base slice (1.5 ms on 2 cores) is checked at the tick: 4 ms at 250 Hz, 2 ms at 1000 Hz
    assert tick_slice_s(2, hz=250) == pytest.approx(4e-3) and tick_slice_s(2, hz=1000) == pytest.approx(2e-3)
    assert tick_slice_s(8, hz=1000) == pytest.approx(3e-3) and tick_slice_s(1, hz=100) == pytest.approx(10e-3)


def fan_in_graph(k: int, tile: int = 16):
    """k axpy tasks y_i += x_i: x on rank 0, y on rank 1 (owner-computes runs them all on rank 1 and sends
    every x_i there, each ready at the step's start)."""
    b = GraphBuilder(Tiling.uniform(tile))
    x = b.tensor("x", (k * tile, tile), ("seq", None), "param")
    y = b.tensor("y", (k * tile, tile), ("seq", None), "activation")
    i = np.arange(k)
    b.add("axpy", [x.tile_ids(i, 0), y.tile_ids(i, 0)], dict(n=tile * tile, alpha=1.0))
    g = b.build()
    owner = np.zeros(g.n_tiles, dtype=np.int32)
    owner[y.tile_ids(i, 0)] = 1
    return g, Distribution("test", 2, owner)


def driven_fan_in(k: int, message_s: float, d: float):
    """A run of :func:`fan_in_graph` on one worker per rank whose progress thread runs the worker (2 cores), each
    message ``message_s`` and no bandwidth cost, each task ``d`` seconds: ``simulate(**kw)``, the simulated
    step's makespan, and the machine (for its task overhead). The step is ``message_s + k * (overhead + d)``
    plus what ``kw`` charges the worker per task."""
    g, dist = fan_in_graph(k)
    m = cpu_machine(1)
    net = Network(latency_s=0.0, bandwidth_Bps=1e15, message_s=message_s)
    durs = np.full((1, k), d)

    def simulate(sharing=None, **kw):
        sharing = sharing or CoreSharing(cores=2, ranks=2, workers_per_rank=1, progress_drives_worker=True,
                                         slice_s=1e-3)
        return simulate_ranks(g, dist, m, net, "lws", 1, durations=durs, sharing=sharing, nic="node",
                              **kw).makespan

    return simulate, m


def test_messages_posted_together_pay_their_cost_once():
    # StarPU-MPI posts the k sends together and tests them together (_starpu_mpi_progress_thread_func):
    # every x_i arrives after one message cost c, then rank 1 runs its k tasks one after another. Held per
    # message on the interface, the last x_i would arrive only after k x c.
    k, c, d = 8, 1e-3, 1e-4
    g, dist = fan_in_graph(k)
    m = cpu_machine(1)
    net = Network(latency_s=0.0, bandwidth_Bps=1e15, message_s=c)
    free = CoreSharing(cores=64, ranks=2, workers_per_rank=1, progress_drives_worker=False)
    res = simulate_ranks(g, dist, m, net, "lws", 1, durations=np.full((1, k), d), sharing=free, nic="node")
    assert res.summary["messages"] == k and np.all(res.task_rank == 1)
    assert np.allclose(res.messages["end"], c, rtol=1e-6)
    assert res.makespan == pytest.approx(c + k * (m.task_overhead + d), rel=1e-6)


def test_the_forecast_as_a_trace(graph):
    from tilecast.simulator.ranks import ranks_trace

    g, d = prepare(graph, 2, "data")
    res = simulate_ranks(g, d, cpu_machine(1), NO_LATENCY, "lws", 1, durations=durations(g), nic="node")
    df = ranks_trace(res, g)
    moved = df[df["kernel"] == "transfer"]
    assert len(df) == g.n_tasks + res.summary["messages"] and (df["source"] == "sim").all()
    assert moved["bytes"].sum() == res.summary["bytes_moved"] and set(moved["worker"]) == {1000, 1001}
    assert df["end_s"].max() == pytest.approx(res.makespan) and df.attrs["step_s"] == res.makespan


def test_the_step_ends_after_the_main_threads_barrier():
    # 2 ranks of 1 thread (the progress thread runs worker 0) and 2 background threads on 2 cores, slices of
    # 1 ms: a period of 2 ms; rank 0's slot starts at 0, 2, 4 ... ms, rank 1's at 1, 3, 5 ... ms
    sh = CoreSharing(cores=2, ranks=2, workers_per_rank=1, progress_drives_worker=True, background=2, slice_s=1e-3)
    assert sh.period == pytest.approx(2e-3) and sh.phase(1) == pytest.approx(1e-3)
    assert sh.next_turn(0, 0.5e-3) == pytest.approx(2e-3) and sh.next_turn(1, 0.5e-3) == pytest.approx(1e-3)
    # rank 0 ends at 0.5 ms: wakes at 2, waits again until 4; rank 1 ends at 0.2 ms: wakes at 1, again at 3;
    # the barrier is whole at 4 ms, when rank 1 next runs at 5 ms
    assert sh.step_end([0.5e-3, 0.2e-3]) == pytest.approx(5e-3)
    free = CoreSharing(cores=8, ranks=2, workers_per_rank=1, progress_drives_worker=True)
    assert free.step_end([0.5e-3, 0.2e-3]) == 0.5e-3 and free.next_turn(0, 0.3) == 0.3


def test_ten_sends_in_flight_per_rank():
    # 12 tiles of 16 KB (above the eager size: each send completes once received), all ready at the start:
    # StarPU-MPI posts 10 (STARPU_MPI_NDETACHED_SEND), the last 2 once the first complete, one message cost c
    # later; rank 1 runs its first 10 tasks before they arrive
    k, c, d = 12, 5e-3, 1e-4
    g, dist = fan_in_graph(k, tile=64)
    m = cpu_machine(1)
    net = Network(latency_s=0.0, bandwidth_Bps=1e15, message_s=c, eager_bytes=4064)
    free = CoreSharing(cores=64, ranks=2, workers_per_rank=1, progress_drives_worker=False)
    res = simulate_ranks(g, dist, m, net, "lws", 1, durations=np.full((1, k), d), sharing=free, nic="node")
    ends = np.sort(res.messages["end"])
    assert np.allclose(ends[:10], c) and np.allclose(ends[10:], 2 * c)
    assert res.makespan == pytest.approx(2 * c + 2 * (m.task_overhead + d), rel=1e-6)
    # eager messages (the default without a transport) are not held back
    eager = simulate_ranks(g, dist, m, Network(latency_s=0.0, bandwidth_Bps=1e15, message_s=c), "lws", 1,
                           durations=np.full((1, k), d), sharing=free, nic="node")
    assert eager.makespan == pytest.approx(c + k * (m.task_overhead + d), rel=1e-6)
