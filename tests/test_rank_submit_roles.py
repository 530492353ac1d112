"""The main threads' submission cost by role, the progress thread's CPU per message, and the step's end on a
quiet machine (the rank simulator's rules of tilecast.simulator.submit_roles and ranks_threads)."""

import shutil

import numpy as np
import pytest

from tests.test_rank_simulator import cpu_machine
from tests.test_rank_threads import driven_fan_in, fan_in_graph
from tilecast.errors import FieldError
from tilecast.graph.owner_computes import plan
from tilecast.perfmodel.network import Network
from tilecast.simulator.ranks import simulate_ranks
from tilecast.simulator.ranks_submission import release_times
from tilecast.simulator.ranks_threads import CoreSharing
from tilecast.simulator.submit_roles import ROLES, fit_roles, role_counts, task_seconds

ROLE_COSTS = dict(exec=1e-3, other=0.5e-3, send=1e-3, recv=2e-3, drop=0.25e-3)


def test_each_rank_pays_for_its_role_in_each_task():
    # the fan-in: every task runs on rank 1 and needs one tile of rank 0's, sent when the task is inserted
    k = 4
    g, dist = fan_in_graph(k)
    p = plan(g, dist.owner, 2)
    counts = role_counts(p.task_rank, p.transfers, 2, g)
    assert counts.shape == (2, k, len(ROLES))
    # rank 1's task reads x_i after the receive wrote it: one implicit dependency (y_i is accessed first)
    assert counts[0].tolist() == [[0, 1, 1, 0, 0, 0]] * k and counts[1].tolist() == [[1, 0, 0, 1, 0, 1]] * k
    cost = task_seconds(ROLE_COSTS, counts)
    assert cost[0] == pytest.approx([1.5e-3] * k) and cost[1] == pytest.approx([3e-3] * k)


def test_fit_recovers_the_roles_and_leaves_preempted_insertions_out():
    rng = np.random.default_rng(0)
    n = 400
    counts = np.zeros((2, n, 6))
    runs = rng.random((2, n)) < 0.5
    counts[..., 0], counts[..., 1] = runs, ~runs
    counts[..., 2] = rng.integers(0, 3, (2, n)) * (rng.random((2, n)) < 0.1)
    counts[..., 3] = rng.integers(0, 3, (2, n)) * (rng.random((2, n)) < 0.1)
    counts[..., 4] = rng.integers(1, 9, (2, n)) * (rng.random((2, n)) < 0.1) * ~runs
    counts[..., 5] = rng.integers(0, 20, (2, n)) * runs
    true = dict(exec=1.2e-6, other=0.2e-6, send=3e-6, recv=5e-6, drop=0.8e-6, deps=0.5e-6)
    seconds = task_seconds(true, counts)
    seconds[0, ::50] += 4e-3  # the thread lost its core in these: left out
    seconds[1, 7] = np.nan  # not timed
    fit = fit_roles(counts, seconds)
    assert set(fit) == set(ROLES) and all(fit[r] == pytest.approx(true[r], rel=1e-6) for r in ROLES)
    # scaled to the CPU time the insertions took (thread_time), the preempted ones' CPU included
    total = float(np.nansum(np.where(np.isnan(seconds), np.nan, task_seconds(true, counts))))
    scaled = fit_roles(counts, seconds, cpu_s=[1.1 * total])
    assert all(scaled[r] == pytest.approx(1.1 * true[r], rel=1e-6) for r in ROLES)
    with pytest.raises(ValueError, match="send"):
        fit_roles(np.where(np.arange(6) == 2, 0.0, counts), seconds)
    # some of the roles, in their order: the fit without a cost per dependency
    five = fit_roles(counts[..., :5], task_seconds({**true, "deps": 0.0}, counts), roles=ROLES[:5])
    assert set(five) == set(ROLES[:5]) and five["recv"] == pytest.approx(true["recv"], rel=1e-6)


def axpy_chain(on_rank_1: str = ""):
    """x += w, y += x, z += x, x += w, y += x on one tile each; the tensors named in ``on_rank_1`` owned by rank 1,
    the others by rank 0: (graph, plan on as many ranks as own a tensor)."""
    from tilecast.graph import GraphBuilder, Tiling
    from tilecast.graph.distribution import Distribution

    b = GraphBuilder(Tiling.uniform(4))
    t = {name: b.tensor(name, (4, 4), ("seq", None), "activation") for name in "wxyz"}
    for a, c in ("wx", "xy", "xz", "wx", "xy"):
        b.add("axpy", [t[a].tile_ids([0], 0), t[c].tile_ids([0], 0)], dict(n=16, alpha=1.0))
    g = b.build()
    owner = np.zeros(g.n_tiles, dtype=np.int32)
    owner[[t[name].first_tile for name in on_rank_1]] = 1
    ranks = 2 if on_rank_1 else 1
    return g, plan(g, Distribution("test", ranks, owner).owner, ranks)


def test_a_rank_drops_its_received_copy_when_its_owner_writes_it():
    from tilecast.simulator.submit_roles import drop_counts

    # x and w on rank 0, y and z on rank 1: x += w; y += x and z += x on rank 1 (x received once, read twice);
    # x += w again on rank 0 (rank 1's copy dropped behind its two readers); y += x (received again, never dropped)
    g, p = axpy_chain("yz")
    assert p.task_rank.tolist() == [0, 1, 1, 0, 1] and len(p.transfers) == 2
    assert drop_counts(g, p.task_rank, p.transfers, 1).tolist() == [0, 0, 0, 2, 0]
    assert not drop_counts(g, p.task_rank, p.transfers, 0).any()  # rank 0 receives nothing
    counts = role_counts(p.task_rank, p.transfers, 2, g)
    assert counts[1, 3].tolist() == [0, 1, 0, 0, 2, 0] and task_seconds(ROLE_COSTS, counts)[1, 3] == pytest.approx(1e-3)
    # implicit dependencies where each rank runs the task: rank 1 reads its received x (1), z and y are new, then
    # y is rewritten (1 more); rank 0's second x += w writes x after the send read it
    assert counts[1, :, 5].tolist() == [0, 1, 1, 0, 2] and counts[0, :, 5].tolist() == [0, 0, 0, 1, 0]


def test_a_write_depends_on_every_read_since_the_last_write():
    from tilecast.simulator.submit_roles import implicit_deps

    # one rank: x += w (x new), y += x and z += x (each reads x once written), x += w again (after two reads),
    # then y += x (x last written, y written once since)
    g, p = axpy_chain()
    assert implicit_deps(g, p.task_rank, p.transfers, 0).tolist() == [0, 1, 1, 2, 2]
    # nothing runs on another rank: no dependency counted there
    assert not implicit_deps(g, p.task_rank, p.transfers, 1).any()


def test_release_times_follow_each_ranks_costs():
    # every thread on a core of its own: task i is submitted once tasks 0..i have had their CPU time
    free = CoreSharing(cores=8, ranks=2, workers_per_rank=1, progress_drives_worker=True)
    cost = np.array([[1e-3, 2e-3, 3e-3], [0.5e-3, 0.5e-3, 4e-3]])
    assert release_times(free, 3, cost) == pytest.approx(np.cumsum(cost, axis=1))
    assert release_times(free, 3, 1e-3) == pytest.approx(np.array([[1e-3, 2e-3, 3e-3]] * 2))


def test_simulated_submission_by_role():
    k, d = 8, 1e-3
    g, dist = fan_in_graph(k)
    m = cpu_machine(1)
    net = Network(latency_s=0.0, bandwidth_Bps=1e15, message_s=1e-5)
    sh = CoreSharing(cores=2, ranks=2, workers_per_rank=1, progress_drives_worker=True, slice_s=1e-3)
    durs = np.full((1, k), d)

    def sim(**kw):
        return simulate_ranks(g, dist, m, net, "lws", 1, durations=durs, sharing=sh, nic="node", **kw)

    # the same cost for every role and no cost per message: the flat rule
    flat = dict(exec=2e-3, other=2e-3, send=0.0, recv=0.0)
    assert sim(submit_roles=flat).makespan == pytest.approx(sim(submit_cpu_task_s=2e-3).makespan)
    # rank 0 pays other + send = 1.5 ms per task, rank 1 exec + recv = 3 ms; each main thread shares its rank's
    # thread half and half (2 threads and 2 main threads on 2 cores): rank 1 has submitted the step at 48 ms
    res = sim(submit_roles=ROLE_COSTS)
    assert res.summary["threads"]["submit_end_s"] == pytest.approx(2 * k * 3e-3)
    assert res.makespan >= 2 * k * 3e-3


def test_the_progress_thread_handles_each_message_between_tasks():
    # every x_i arrives at c; rank 1's progress thread runs its worker, so it receives one message per gap
    # between tasks and spends m on it before the next task: the step is c + k (m + overhead + d)
    k, c, m_cpu, d = 8, 1e-3, 0.2e-3, 1e-4
    sim, m = driven_fan_in(k, c, d)
    without = sim()
    assert without == pytest.approx(c + k * (m.task_overhead + d), rel=1e-6)
    assert sim(message_cpu_s=m_cpu) == pytest.approx(c + k * (m_cpu + m.task_overhead + d), rel=1e-6)
    # a progress thread of its own (not running the worker): its time is not taken from the worker here
    own = CoreSharing(cores=8, ranks=2, workers_per_rank=1, progress_drives_worker=False)
    assert sim(own, message_cpu_s=m_cpu) == pytest.approx(without, rel=1e-6)


def test_a_quiet_machine_ends_the_step_at_once():
    # slices of 1 ms on 2 cores, the ranks' 2 threads with a trace of other work (0.02 threads, what a quiet
    # machine measures): the main threads' wakes wait 1% of a loaded machine's, so the step ends within
    # microseconds of its last event, where 2 threads of other work make it wait for the ranks' next slots
    last = [0.5e-3, 0.2e-3]
    quiet = CoreSharing(cores=2, ranks=2, workers_per_rank=1, progress_drives_worker=True, background=0.02,
                        slice_s=1e-3)
    loaded = CoreSharing(cores=2, ranks=2, workers_per_rank=1, progress_drives_worker=True, background=2,
                         slice_s=1e-3)
    half = CoreSharing(cores=2, ranks=2, workers_per_rank=1, progress_drives_worker=True, background=1,
                       slice_s=1e-3)
    assert quiet.shared and quiet.step_end(last) - max(last) < 0.05e-3
    assert loaded.step_end(last) == pytest.approx(5e-3)
    assert quiet.step_end(last) < half.step_end(last) < loaded.step_end(last)


def test_network_checks_its_roles():
    assert Network(latency_s=0.0, bandwidth_Bps=1.0, submit_roles=dict(ROLE_COSTS)).submit_roles["recv"] == 2e-3
    with pytest.raises(FieldError, match="submit_roles"):
        Network(latency_s=0.0, bandwidth_Bps=1.0, submit_roles={"exec": -1e-6})


@pytest.mark.skipif(not shutil.which("mpirun"), reason="Open MPI's mpirun is not installed (apt-get install "
                    "openmpi-bin libopenmpi-dev libstarpu-dev)")
def test_a_run_times_each_insertion():
    from tilecast.executor.mpi_launch import run_mpi
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model
    from tilecast.graph.models import build_step
    from tilecast.loop.ranks_probe import submit_roles_of

    cfg, tiling = load_model("gpt2-tiny"), Tiling.parse("32,batch=1")
    r = run_mpi(cfg, 2, 32, tiling, "lws", 1, 1, 2, "data", timeout_s=300)
    at = r.submit_at_s
    assert at.shape == (2, r.n_tasks + 1) and np.isfinite(at).all()
    assert (at[:, 0] >= 0).all() and (np.diff(at, axis=1) >= 0).all()
    assert (at[:, -1] - at[:, 0] <= r.rank_step_s[:, -1] + 1e-3).all()  # submitted within the step
    roles = submit_roles_of([r], build_step(cfg, 2, 32, tiling), 2, "data")
    assert set(roles) == set(ROLES) and all(np.isfinite(v) and v >= 0 for v in roles.values())
