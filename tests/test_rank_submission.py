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


def test_main_threads_share_their_ranks_slots():
    # 2 ranks of 1 thread (the progress thread runs worker 0) and 2 other threads on 2 cores, slices of 1 ms:
    # a period of 2 ms, rank 0's thread on in [0, 1), [2, 3) ... While rank 0's main thread submits, it and
    # that thread share those slots half and half, each at half speed throughout (the rule without turns)
    sh = CoreSharing(cores=2, ranks=2, workers_per_rank=1, progress_drives_worker=True, background=2, slice_s=1e-3)
    assert sh.on_time(0, 0.0, 10e-3) == pytest.approx(5e-3) and sh.on_time(0, 0.5e-3, 2.5e-3) == pytest.approx(1e-3)
    # 10 tasks of 0.25 ms of CPU each: 2.5 ms of CPU at half of 1 ms in 2 ms, all submitted at 9 ms
    rel = release_times(sh, 10, 0.25e-3, turns=False)
    assert rel.shape == (2, 10) and rel[0, 0] == pytest.approx(0.5e-3) and rel[0, -1] == pytest.approx(9e-3)
    assert np.all(np.diff(rel[0]) > 0)
    two = Submitting(sh, rel[:, -1], turns=False)
    th = sh.worker_thread(0, 0)
    # a kernel of 2 ms from 0: 0.5 ms in each of its slots until 9 ms, so 4 slots: [6, 7) ends it
    assert two.finish(th, 0.0, 2e-3) == pytest.approx(7e-3)
    # one of 3 ms: 2.5 ms by 9 ms (5 slots), the last 0.5 ms at full speed in [10, 11)
    assert two.finish(th, 0.0, 3e-3) == pytest.approx(10.5e-3)
    assert two.finish(sh.progress_thread(0), 20e-3, 1e-3) == sh.finish(th, 20e-3, 1e-3)  # after: as before
    assert two.step_end([1e-3, 2e-3]) >= rel.max()  # the step ends after the last task is submitted
    # every thread, the main threads included, on a core of its own: nothing shared, submission at full rate
    free = CoreSharing(cores=8, ranks=2, workers_per_rank=1, progress_drives_worker=True)
    assert release_times(free, 4, 1e-3)[1, -1] == pytest.approx(4e-3)
    assert Submitting(free, [4e-3, 4e-3]).finish(0, 0.0, 1e-3) == pytest.approx(1e-3)


def test_main_thread_and_worker_take_turns_of_a_slice():
    # the same 2 ranks and slots: rank 0's thread on in [0, 1), [2, 3) ..., rank 1's in [1, 2), [3, 4) ...
    # While a rank submits, its main thread and worker take its slots in turns (half each: one slice each),
    # rank 0's main thread first, rank 1's pattern shifted by half a period of the turns, its worker first
    sh = CoreSharing(cores=2, ranks=2, workers_per_rank=1, progress_drives_worker=True, background=2, slice_s=1e-3)
    rel = release_times(sh, 10, 0.25e-3)
    # rank 0's main thread: [0, 1), [4, 5), [8, 8.5) ms for its 2.5 ms; rank 1's: [3, 4), [7, 8), [11, 11.5)
    assert rel[0, 0] == pytest.approx(0.25e-3) and rel[0, -1] == pytest.approx(8.5e-3)
    assert rel[1, 0] == pytest.approx(3.25e-3) and rel[1, -1] == pytest.approx(11.5e-3)
    two = Submitting(sh, rel[:, -1])
    w0, w1 = sh.worker_thread(0, 0), sh.worker_thread(1, 0)
    # rank 0's worker has [2, 3) and [6, 7) until its main thread is done at 8.5 ms, then all its slots
    assert two.finish(w0, 0.0, 0.5e-3) == pytest.approx(2.5e-3)
    assert two.finish(w0, 0.0, 1.5e-3) == pytest.approx(6.5e-3)
    assert two.finish(w0, 0.0, 2.25e-3) == pytest.approx(8.75e-3)
    # it polls (StarPU-MPI's progress) only in its turns: a message for it waits for the next one
    assert two.next_on(w0, 0.0) == pytest.approx(2e-3) and two.next_on(w0, 3.5e-3) == pytest.approx(6e-3)
    assert two.next_on(w0, 8e-3) == pytest.approx(8.5e-3)  # its next turn would be after the submission's end
    # rank 1's worker: its first slot [1, 2) is its own
    assert two.next_on(w1, 0.0) == pytest.approx(1e-3) and two.finish(w1, 0.0, 1.5e-3) == pytest.approx(5.5e-3)
    assert two.finish(w0, 20e-3, 1e-3) == sh.finish(w0, 20e-3, 1e-3)  # after the submission: as before
    # the measured part: at 0.75 a period of the turns is 4 slots, 3 of them the main thread's, then the worker's
    # slice: rank 0's main thread's 2.5 ms end in its 3rd slot, at 4.5 ms; its worker first runs in the 4th, [6, 7)
    rel = release_times(sh, 10, 0.25e-3, share=0.75)
    assert rel[0, -1] == pytest.approx(4.5e-3) and Submitting(sh, [9e-3, 9e-3], share=0.75).next_on(w0, 0.0) == \
        pytest.approx(6e-3)


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
    # 2 threads and 2 main threads on 2 cores: each main thread has half a core, so submits task i at
    # 2 x (i + 1) x 2 ms, the last at 32 ms; rank 1 runs its tasks as they come (each 1 ms of CPU at half
    # speed), and the step cannot end before the last is submitted
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


def test_forecast_rules_are_switches():
    # the forecast as simulate --ranks gives it: the main threads' rule on, the pipelined rendezvous' turns off
    from dataclasses import replace

    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model
    from tilecast.loop.ranks_forecast import forecast_ranks

    cfg = load_model('{"n_layer":2,"n_embd":128,"n_head":2,"vocab_size":256,"n_positions":128}')
    m = cpu_machine(1)
    m = replace(m, meta={**m.meta, "hardware": {"cores": 2}})
    net = Network(latency_s=1e-6, bandwidth_Bps=1e10, message_s=1e-5, transport=SHM, submit_task_s=1e-6,
                  submit_cpu_task_s=20e-6)

    def step(**kw):
        return forecast_ranks(cfg, 2, 128, Tiling.parse("128,batch=1"), "lws", 2, "data", m, None, None, net,
                              background=4, **kw)

    default, f = step(), step(pipeline_turns=False)
    assert default.step_s == f.step_s and default.bytes_moved == f.bytes_moved
    assert default.summary["threads"]["submit_end_s"] > 0
    assert step(pipeline_turns=True).step_s > default.step_s  # 64 KB tiles: every message pipelined
    assert step(main_threads=False).summary["threads"]["submit_end_s"] is None
