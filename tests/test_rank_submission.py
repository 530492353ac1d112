"""The rank simulator's main threads (submitting beside the workers) and Open MPI's pipelined rendezvous."""

import numpy as np
import pytest

from tests.test_rank_simulator import cpu_machine
from tests.test_rank_threads import fan_in_graph
from tilecast.perfmodel.network import Network, fit_network
from tilecast.simulator.ranks import simulate_ranks
from tilecast.simulator.ranks_submission import Submitting, release_times
from tilecast.simulator.ranks_threads import CoreSharing

SHM = "Open MPI 4.1.4, one host (test, shared memory)"


def test_main_threads_take_slots_of_their_ranks_session():
    # 2 ranks of 1 thread on 2 cores, nothing else: a core each. While the main threads submit, 4 threads on
    # 2 cores: slices of 1 ms in a period of 2 ms, so a thread gets half a core
    sh = CoreSharing(cores=2, ranks=2, workers_per_rank=1, progress_drives_worker=True, slice_s=1e-3)
    assert not sh.shared
    during = sh.with_main_threads()
    assert during.threads == 4 and during.period == pytest.approx(2e-3) and during.main_thread(1) == 3
    # with other work, the ranks' session keeps its share: 2 threads of a share 2/(2+6) each become 4 of half that
    busy = CoreSharing(cores=2, ranks=2, workers_per_rank=1, progress_drives_worker=True, background=6,
                       slice_s=1e-3)
    assert busy.with_main_threads().core_share == pytest.approx(2 * busy.core_share)
    assert during.on_time(0, 0.0, 10e-3) == pytest.approx(5e-3) and sh.on_time(0, 1.0, 1.5) == 0.5
    # 10 tasks of 0.5 ms each: the main thread has submitted them all after 5 ms of CPU, 10 ms of wall time
    rel = release_times(sh, 10, 0.5e-3)
    assert rel.shape == (2, 10) and rel[0, -1] == pytest.approx(10e-3) and np.all(np.diff(rel[0]) > 0)
    two = Submitting(sh, rel.max())
    # a kernel of 4 ms from 0 on worker 0 of rank 0: on in [0, 1), [2, 3) ... until submission ends (10 ms)
    assert two.finish(sh.worker_thread(0, 0), 0.0, 4e-3) == pytest.approx(7e-3)
    # one of 8 ms: 5 ms of it by 10 ms, the rest at full speed after
    assert two.finish(sh.worker_thread(0, 0), 0.0, 8e-3) == pytest.approx(13e-3)
    assert two.step_end([1e-3, 2e-3]) >= rel.max()  # the step ends after the last task is submitted


def test_submission_delays_and_slows_the_step():
    k, d = 8, 1e-3
    g, dist = fan_in_graph(k)
    m = cpu_machine(1)
    net = Network(latency_s=0.0, bandwidth_Bps=1e15, message_s=1e-5)
    sh = CoreSharing(cores=2, ranks=2, workers_per_rank=1, progress_drives_worker=True, slice_s=1e-3)
    durs = np.full((1, k), d)
    free = simulate_ranks(g, dist, m, net, "lws", 1, durations=durs, sharing=sh, nic="node")
    sub = simulate_ranks(g, dist, m, net, "lws", 1, durations=durs, sharing=sh, nic="node",
                         submit_cpu_task_s=2e-3)
    # rank 1's main thread submits task i at 2 x (i + 1) x 2 ms (half a core): the last at 32 ms; the tasks
    # run as they are submitted (each 1 ms, stretched to 2 ms during submission), the step ends after it
    assert sub.summary["threads"]["submit_end_s"] == pytest.approx(32e-3)
    assert free.makespan < 12e-3 and sub.makespan > 32e-3
    assert np.all(sub.start >= np.sort(release_times(sh, k, 2e-3)[1]) - 1e-12)


def test_pipelined_rendezvous_waits_for_the_senders_turn():
    # 1 tile of 64 KB from rank 0 to rank 1 on 2 cores shared with 2 other threads (slices of 1 ms, period
    # 2 ms; rank 0's progress thread on at [0, 1) ms, rank 1's at [1, 2) ms): the first fragment arrives at
    # once, rank 1 matches it at 1 ms, rank 0 sends the rest at 2 ms, rank 1 receives it at 3 ms. A message of
    # 16 KB (one fragment) is received at rank 1's first turn, 1 ms.
    m = cpu_machine(1)
    sh = CoreSharing(cores=2, ranks=2, workers_per_rank=1, progress_drives_worker=True, background=2, slice_s=1e-3)
    net = Network(latency_s=0.0, bandwidth_Bps=1e15, message_s=0.0, transport=SHM)
    assert net.protocol(16384) == "rendezvous" and net.protocol(65536) == "pipeline" and net.protocol(8) == "eager"
    ends = {}
    for tile in (64, 128):
        g, dist = fan_in_graph(1, tile=tile)
        res = simulate_ranks(g, dist, m, net, "lws", 1, durations=np.zeros((1, 1)), sharing=sh, nic="node")
        ends[tile * tile * 4] = float(res.messages["end"][0])
    assert ends[16384] == pytest.approx(1e-3) and ends[65536] == pytest.approx(3e-3)
    # the earlier rule (every message above the eager size carried by one fragment): 1 ms for both
    g, dist = fan_in_graph(1, tile=128)
    old = Network(latency_s=0.0, bandwidth_Bps=1e15, message_s=0.0, transport=SHM, rndv_bytes=1 << 62)
    res = simulate_ranks(g, dist, m, old, "lws", 1, durations=np.zeros((1, 1)), sharing=sh, nic="node")
    assert float(res.messages["end"][0]) == pytest.approx(1e-3)


def test_fit_gives_each_protocol_its_intercept():
    # one-way: 10 us + b / 1 GB/s, a rendezvous 3 us more, a pipeline 8 us more; MPI's latency 2 us
    sizes = np.array([8, 1024, 4000, 4200, 16384, 32000, 33000, 65536, 262144, 1 << 20])
    net0 = Network(latency_s=0, bandwidth_Bps=1, transport=SHM, eager_bytes=4064, rndv_bytes=32720)
    extra = np.array([{"eager": 0, "rendezvous": 3e-6, "pipeline": 8e-6}[net0.protocol(int(b))] for b in sizes])
    net = fit_network(sizes, 10e-6 + sizes / 1e9 + extra, 2e-6 + sizes / 5e9, transport=SHM, eager_bytes=4064,
                      rndv_bytes=32720)
    assert net.bandwidth_Bps == pytest.approx(1e9, rel=1e-6) and net.message_s == pytest.approx(8e-6)
    assert net.protocol_s["rendezvous"] == pytest.approx(3e-6) and net.protocol_s["pipeline"] == pytest.approx(8e-6)
    assert net.protocol_extra_s(65536) == pytest.approx(8e-6) and net.protocol_extra_s(8) == 0.0
    with pytest.raises(ValueError, match="submit_cpu_task_s"):
        Network(latency_s=0.0, bandwidth_Bps=1.0, submit_cpu_task_s=-1.0)
