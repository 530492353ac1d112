"""Each rank's threads read from the scheduler's counts, and the main thread's measured part of its rank's slots."""

import shutil
import threading
import time

import numpy as np
import pytest

from tilecast.executor.mpi_threads import submit_share_of, thread_deltas, thread_groups, thread_times
from tilecast.perfmodel.network import FieldError, Network
from tilecast.simulator.ranks_submission import Submitting, release_times
from tilecast.simulator.ranks_threads import CoreSharing


def test_thread_times_count_a_spinning_threads_cpu():
    if not thread_times():
        pytest.skip("/proc/self/task/<tid>/schedstat is not readable here")
    done = threading.Event()
    tid = []

    def spin():
        tid.append(threading.get_native_id())
        x = 0
        while not done.is_set():
            x += 1

    before = thread_times()
    th = threading.Thread(target=spin, name="spinner")
    th.start()
    while not tid:
        time.sleep(0.001)
    t0 = thread_times()[tid[0]][1]
    while thread_times()[tid[0]][1] - t0 < 0.02:  # until it has had 20 ms on a core, however loaded the machine
        time.sleep(0.005)
    after = thread_times()
    done.set()
    th.join()
    d = thread_deltas(before, after)
    assert d[tid[0]][1] >= 0.02 and d[tid[0]][2] >= 0.0  # started between the readings: counted from 0
    assert all(run >= 0 and wait >= 0 for _, run, wait in d.values())


def _threads(main, worker, helper, sub_main, sub_worker):
    """One rank's readings over 3 steps: the first step is left out of the medians."""
    names = ["main", "CPU 0", "MPI"]
    run = np.array([[9.0, 9.0, 9.0], [main, worker, helper], [main, worker, helper]])
    sub = np.array([[1.0, 0.0, 0.0], [sub_main, sub_worker, 0.0], [sub_main, sub_worker, 0.0]])
    return {"name": names, "run_s": run, "wait_s": run / 2,
            "submit": {"name": names, "run_s": sub, "wait_s": sub}}


def test_groups_and_the_submit_share():
    th = [_threads(0.01, 0.05, 0.0, 0.01, 0.03), _threads(0.02, 0.04, 0.001, 0.02, 0.02)]
    g = thread_groups(th)
    assert g[0]["main"] == [0.01, 0.005] and g[0]["worker"] == [0.05, 0.025] and g[1]["other"][0] == 0.001

    class Run:
        threads = th

    # rank 0: 0.01 of 0.04 s, rank 1: 0.02 of 0.04 s, in both steps after the first: median 0.375
    assert submit_share_of([Run]) == pytest.approx(0.375)

    class Unread:
        threads = None

    assert submit_share_of([Unread]) is None


def test_the_main_thread_takes_its_measured_part_of_the_slots():
    # 2 ranks of 1 thread on 2 cores with 2 other threads, slices of 1 ms: rank 0's worker on in [0, 1), [2, 3) ...
    sh = CoreSharing(cores=2, ranks=2, workers_per_rank=1, progress_drives_worker=True, background=2, slice_s=1e-3)
    th = sh.worker_thread(0, 0)
    # at that part of the slots' speed throughout (the rule without turns, test_rank_submission.py has the turns):
    # 10 tasks of 0.1 ms of CPU: 1 ms of CPU at a quarter of the slots (1 ms in 2 ms) takes 4 slots: done at 7 ms
    rel = release_times(sh, 10, 0.1e-3, share=0.25, turns=False)
    assert rel[0, -1] == pytest.approx(7e-3) and rel[0, 0] == pytest.approx(0.4e-3)
    # the even split, as before: 2 slots, done at 3 ms
    assert release_times(sh, 10, 0.1e-3, turns=False)[0, -1] == pytest.approx(3e-3)
    sub = Submitting(sh, rel[:, -1], share=0.25, turns=False)
    # a kernel of 1.5 ms from 0: three quarters of each slot until 7 ms, 0.75 ms per slot: [2, 3) ends it
    assert sub.finish(th, 0.0, 1.5e-3) == pytest.approx(3e-3)
    # one of 3.5 ms: 3 ms in the 4 slots before 7 ms, the last 0.5 ms at full speed in [8, 9)
    assert sub.finish(th, 0.0, 3.5e-3) == pytest.approx(8.5e-3)
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="submit_share"):
            Submitting(sh, rel[:, -1], share=bad)
    with pytest.raises(FieldError, match="submit_share"):
        Network(latency_s=0.0, bandwidth_Bps=1e9, submit_share=1.5)


@pytest.mark.skipif(not shutil.which("mpirun"), reason="Open MPI's mpirun is not installed (apt-get install "
                    "openmpi-bin libopenmpi-dev libstarpu-dev)")
def test_a_run_reads_its_ranks_threads():
    from tilecast.executor.mpi_launch import run_mpi
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model

    r = run_mpi(load_model("gpt2-tiny"), 2, 32, Tiling.parse("32,batch=1"), "lws", 1, 2, 2, "layer", timeout_s=300,
                read_threads=True)
    assert r.threads is not None and len(r.threads) == 2
    for th in r.threads:
        assert "main" in th["name"] and any(n.startswith("CPU ") for n in th["name"])
        assert th["run_s"].shape == (2, len(th["name"])) and (th["run_s"] >= 0).all() and (th["wait_s"] >= 0).all()
        # the submission is part of the step: no thread had more of a core by its end than by the step's
        sub = th["submit"]
        assert sub["name"] == th["name"] and (sub["run_s"] <= th["run_s"] + 1e-9).all()
        assert th["run_s"][:, th["name"].index("main")].sum() > 0  # the main thread submitted
    share = submit_share_of([r])
    assert share is None or 0.0 < share < 1.0


def test_main_thread_first_pins_it_and_lowers_the_others():
    """In a child process (the levels cannot be raised back without privilege): the caller is pinned to the
    core asked for, keeps its level, and every other thread, started before, runs HELPER_NICE levels below it."""
    import json
    import subprocess
    import sys

    code = """
import json, os, threading, time
from tilecast.executor.mpi_threads import HELPER_NICE, main_thread_first
stop, tids = threading.Event(), []
def idle():
    tids.append(threading.get_native_id())
    stop.wait()
ths = [threading.Thread(target=idle) for _ in range(2)]
for t in ths:
    t.start()
while len(tids) < 2:
    time.sleep(0.001)
me = threading.get_native_id()
base = os.getpriority(os.PRIO_PROCESS, me)
allowed = sorted(os.sched_getaffinity(0))
core = len(allowed) - 1  # an index among the cores this process may use, as StarPU counts them
got = main_thread_first(core)
out = dict(got=got, base=base, core=core, cpu=allowed[core], mine=os.getpriority(os.PRIO_PROCESS, me),
           cores=sorted(os.sched_getaffinity(0)), others=[os.getpriority(os.PRIO_PROCESS, t) for t in tids],
           want=min(base + HELPER_NICE, 19))
stop.set()
for t in ths:
    t.join()
print(json.dumps(out))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["cores"] == [out["cpu"]] and out["mine"] == out["base"]
    assert out["others"] == [out["want"], out["want"]] and out["got"]["nice"] == out["want"]
    assert out["got"]["lowered"] >= 2 and out["got"]["core"] == out["core"]
