"""The worker's per-task round of StarPU-MPI's progress loop and its CPU per message: measured from a rank's
trace (tilecast.loop.ranks_task_cost) and charged by the rank simulator (ranks_threads.ThreadedRankEngine)."""

import numpy as np
import pytest

from tests.test_rank_threads import driven_fan_in
from tilecast.errors import FieldError
from tilecast.graph import GraphBuilder, Tiling
from tilecast.graph.distribution import Distribution
from tilecast.graph.owner_computes import plan
from tilecast.loop.ranks_forecast import message_cpu_of
from tilecast.loop.ranks_task_cost import WAIT_S, fit_task_costs, received, sent_after
from tilecast.perfmodel.network import Network
from tilecast.simulator.ranks_threads import CoreSharing


def exchange_graph(k: int, tile: int = 4):
    """Per i, in submission order: on rank 0 x_i += w_i (x_i is sent), v_i += w_i; on rank 1 y_i += x_i (it
    receives x_i), z_i += y_i."""
    b = GraphBuilder(Tiling.uniform(tile))
    t = {name: b.tensor(name, (k * tile, tile), ("seq", None), "activation") for name in "wxvyz"}
    for i in range(k):
        for a, c in ("wx", "wv", "xy", "yz"):
            b.add("axpy", [t[a].tile_ids([i], 0), t[c].tile_ids([i], 0)], dict(n=tile * tile, alpha=1.0))
    g = b.build()
    owner = np.zeros(g.n_tiles, dtype=np.int32)
    for name in "yz":
        owner[t[name].tile_ids(np.arange(k), 0)] = 1
    return g, Distribution("test", 2, owner)


def synthetic_trace(g, p, plain, send, recv, kernel=10e-6, submit_end=(0.0, 0.0)):
    """Each rank's tasks back to back in submission order, the gap before each task ``plain``, plus ``send``
    after a task whose tile leaves, plus ``recv`` before a task that reads a received tile; one wait of 1 ms on
    rank 1, and gaps of 40 us before each rank's ``submit_end`` (neither is the runtime's work per task)."""
    tr, rank = p.transfers, p.task_rank
    start, end = np.zeros(g.n_tasks), np.zeros(g.n_tasks)
    rec = received(tr, g.n_tasks)
    for r in range(2):
        sent = sent_after(g, tr, r)
        t, prev = 0.0, None
        for i in np.flatnonzero(rank == r):
            gap = plain + (send if prev is not None and sent[prev] else 0.0) + (recv if rec[i] else 0.0)
            if t < submit_end[r]:
                gap = 40e-6
            if r == 1 and i == np.flatnonzero(rank == 1)[5]:
                gap = 1e-3
            start[i] = t + gap
            end[i] = t = start[i] + kernel
            prev = i
    return start, end, rank


def test_the_fit_reads_the_round_per_task_and_the_cpu_per_message():
    g, dist = exchange_graph(12)
    p = plan(g, dist.owner, 2)
    tr = p.transfers
    assert len(tr) == 12 and set(tr.src.tolist()) == {0} and not tr.back.any()
    assert received(tr, g.n_tasks).sum() == 12 and sent_after(g, tr, 0).sum() == 12
    assert not sent_after(g, tr, 1).any()
    start, end, rank = synthetic_trace(g, p, plain=4e-6, send=3e-6, recv=2e-6, submit_end=(0.05e-3, 0.1e-3))
    got = fit_task_costs([(start, end, rank, np.array([0.05e-3, 0.1e-3]))], g, tr, flat_overhead_s=1e-6)
    assert got["gap_mean_s"] == pytest.approx(4e-6)  # the 1 ms wait and the gaps before the submission's end: out
    assert got["progress_task_s"] == pytest.approx(3e-6)
    assert got["send_extra_s"] == pytest.approx(3e-6) and got["recv_extra_s"] == pytest.approx(2e-6)
    assert got["message_cpu_s"] == pytest.approx(2.5e-6)
    assert 1e-3 > WAIT_S > 40e-6
    # a one-process cost above the gaps: nothing added
    assert fit_task_costs([(start, end, rank, np.zeros(2))], g, tr, flat_overhead_s=WAIT_S)["progress_task_s"] == 0.0


def test_the_round_is_charged_before_each_task_of_the_driven_worker():
    # every x_i arrives at c; rank 1's worker then runs its k tasks, each after the per-task cost and the round:
    # the step is c + k (p + overhead + d); a progress thread of its own takes no round from the worker
    k, c, p_s, d = 8, 1e-3, 0.3e-3, 1e-4
    sim, m = driven_fan_in(k, c, d)
    assert sim() == pytest.approx(c + k * (m.task_overhead + d), rel=1e-6)
    assert sim(progress_task_s=p_s) == pytest.approx(c + k * (p_s + m.task_overhead + d), rel=1e-6)
    own = CoreSharing(cores=8, ranks=2, workers_per_rank=1, progress_drives_worker=False)
    assert sim(own, progress_task_s=p_s) == pytest.approx(sim(own), rel=1e-6)


def test_the_network_holds_the_measured_costs():
    net = Network(latency_s=1e-6, bandwidth_Bps=1e9, message_s=20e-6)
    assert message_cpu_of(net) == pytest.approx(10e-6)  # not measured: half the ping-pong's cost per message
    measured = Network(latency_s=1e-6, bandwidth_Bps=1e9, message_s=20e-6, progress_task_s=1e-6, message_cpu_s=2e-6)
    assert message_cpu_of(measured) == pytest.approx(2e-6)
    assert message_cpu_of(measured, task_costs=False) == pytest.approx(10e-6)
    with pytest.raises(FieldError, match="progress_task_s"):
        Network(latency_s=0.0, bandwidth_Bps=1e9, progress_task_s=-1.0)
