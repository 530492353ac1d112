"""The hand-off of a tile between ranks: the ranks' traces on one clock (MPIRunResult.clock_shift_s) and what
each reader of a received tile waited for (tilecast.loop.ranks_handoff)."""

import shutil

import numpy as np
import pytest

from tests.test_rank_task_cost import exchange_graph
from tilecast.graph.owner_computes import plan
from tilecast.loop.ranks_handoff import handoffs, per_reader

MS = 1e-3


def test_each_reader_waits_for_the_latest_of_its_causes():
    """Three readers of x_i on rank 1, each held by another cause: the tile's writer on rank 0, the receiving
    rank's late insertion of the reader (its receive), and the receiving worker busy with a long task."""
    g, dist = exchange_graph(3)
    p = plan(g, dist.owner, 2)
    shift = np.array([0.0, 0.5 * MS])  # rank 1's trace times + 0.5 ms = rank 0's
    start, end = np.zeros(g.n_tasks), np.zeros(g.n_tasks)
    # rank 0, on its own clock = the shared one: wx_i, wv_i back to back, 1 ms each (tasks 4i, 4i + 1)
    for i in range(3):
        start[4 * i], end[4 * i] = 2 * i * MS, (2 * i + 1) * MS
        start[4 * i + 1], end[4 * i + 1] = (2 * i + 1) * MS, (2 * i + 2) * MS
    # rank 1 (xy_i = 4i + 2 reads x_i; yz_i = 4i + 3), given on the shared clock, stored on rank 1's
    shared = {2: (1.3, 1.5), 3: (1.5, 1.8), 6: (10.2, 10.5), 7: (10.5, 14.0), 10: (14.05, 14.1), 11: (14.1, 14.2)}
    for t, (a, b) in shared.items():
        start[t], end[t] = a * MS - shift[1], b * MS - shift[1]
    submit_at = np.zeros((2, g.n_tasks + 1))
    submit_at[1, 7] = 10.0 * MS - shift[1]  # rank 1 inserts xy_1 (posts its receive) at 10 ms
    h = per_reader(handoffs(g, p.transfers, p.task_rank, start, end, submit_at, shift))
    order = np.argsort(h["task"])
    assert h["task"][order].tolist() == [2, 6, 10]
    assert h["cause"][order].tolist() == ["written", "recv", "free"]
    np.testing.assert_allclose(h["ready"][order], [1.0 * MS, 10.0 * MS, 14.0 * MS])
    np.testing.assert_allclose((h["start"] - h["ready"])[order], [0.3 * MS, 0.2 * MS, 0.05 * MS], atol=1e-12)
    np.testing.assert_allclose(h["written"][order], [1.0 * MS, 3.0 * MS, 5.0 * MS])  # on the shared clock
    assert (h["src"] == 0).all() and (h["dst"] == 1).all() and (h["messages"] == 1).all()


@pytest.mark.skipif(not shutil.which("mpirun"), reason="Open MPI's mpirun is not installed")
def test_on_the_shared_clock_no_reader_starts_before_its_tile_was_written():
    """Two ranks on this host: rank 0's shift is 0, rank 1's is the skew of the ranks' exits of the barrier
    (well under a second), and with the shifts every received tile's reader starts after its writer on the other
    rank ended."""
    from tilecast.executor.mpi_launch import run_mpi
    from tilecast.graph import Tiling
    from tilecast.graph.distribution import prepare
    from tilecast.graph.model_config import load_model
    from tilecast.graph.models import build_step

    cfg, tiling = load_model("gpt2-tiny"), Tiling.parse("32,batch=1")
    r = run_mpi(cfg, 2, 32, tiling, "lws", 1, 1, 2, "layer", timeout_s=300)
    assert r.clock_shift_s is not None and r.clock_shift_s[0] == 0.0 and abs(r.clock_shift_s[1]) < 1.0
    graph, dist = prepare(build_step(cfg, 2, 32, tiling), 2, "layer")
    h = handoffs(graph, plan(graph, dist.owner, 2).transfers, r.task_rank, r.start_s, r.end_s, r.submit_at_s,
                 r.clock_shift_s)
    written = h["written"] > 0
    assert written.sum() > 0 and (h["dst"] == 1).any() and (h["dst"] == 0).any()
    assert (h["start"][written] >= h["written"][written] - 1e-6).all()
