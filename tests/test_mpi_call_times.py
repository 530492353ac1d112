"""The ranks' MPI calls timed by the interposer (tilecast.executor.mpi_call_times) on a real StarPU-MPI run, and
the progress thread's CPU per message fitted on them (tilecast.loop.ranks_message_cpu)."""

import os
import shutil

import numpy as np
import pytest

from tilecast.executor.mpi_call_times import IRECV, ISEND, ISSEND, TEST, request_kinds
from tilecast.executor.mpi_threads import progress_drives_worker
from tilecast.graph import Tiling
from tilecast.graph.distribution import prepare
from tilecast.graph.model_config import load_model
from tilecast.graph.models import build_step
from tilecast.graph.owner_computes import plan
from tilecast.loop.ranks_message_cpu import fit_message_cpu

needs_mpi = pytest.mark.skipif(not (shutil.which("mpirun") and shutil.which("mpicc")),
                               reason="Open MPI's mpirun and mpicc are not installed "
                                      "(apt-get install openmpi-bin libopenmpi-dev)")


@needs_mpi
def test_a_run_times_every_rank_s_calls_on_its_trace_s_clock():
    from tilecast.executor.mpi_launch import run_mpi

    cfg, tiling = load_model("gpt2-tiny"), Tiling.parse("32,batch=1")
    r = run_mpi(cfg, 2, 32, tiling, "lws", 1, 2, 2, "data", mpi_calls=True)
    assert r.mpi_calls is not None and len(r.mpi_calls) == 2
    assert np.all((r.mpi_call_cost_s > 0) & (r.mpi_call_cost_s < 5e-6))
    graph, dist = prepare(build_step(cfg, 2, 32, tiling), 2, "data")
    t = plan(graph, dist.owner, 2).transfers
    for rank, calls in enumerate(r.mpi_calls):
        assert np.all(np.diff(calls["t_s"]) >= 0)
        mine = r.task_rank == rank
        step = (calls["t_s"] >= 0) & (calls["t_s"] <= np.nanmax(r.end_s[mine]))
        op = calls["op"][step]
        sent, received = int(np.sum(t.src == rank)), int(np.sum(t.dst == rank))
        # StarPU-MPI posts an envelope and the data for each message (and a message to itself keeps its
        # progress thread polling: tilecast/executor/c/starpu_mpi_glue.c)
        assert 2 * sent <= np.isin(op, (ISEND, ISSEND)).sum() <= 2 * sent + 4
        assert 2 * received <= (op == IRECV).sum() <= 2 * received + 4
        kind = request_kinds(calls)
        done = (calls["op"] == TEST) & (calls["flag"] != 0)
        assert done.sum() and np.all(kind[done] != 0)  # every completed test names a request posted before it
        if progress_drives_worker(2, 1, os.cpu_count()):
            # the progress thread runs the worker: its calls fall between the rank's tasks, never inside one
            tid = np.bincount(calls["tid"][calls["op"] == TEST] - calls["tid"].min()).argmax() + calls["tid"].min()
            prog = calls[step & (calls["tid"] == tid)]["t_s"]
            idx = np.flatnonzero(mine)
            inside = np.searchsorted(np.sort(r.start_s[idx]), prog, side="right") - np.searchsorted(
                np.sort(r.end_s[idx]), prog, side="left")
            assert np.mean(inside > 0) < 0.01


def synthetic_calls(rng, n_gaps, base, per_test, per_send, per_recv, kernel=20e-6):
    """One rank's tasks and calls: each gap holds 1-4 polling tests and, now and then, a message's send-side calls
    (two posts, two completing tests) or receive-side calls (the same), and lasts what the costs say (a completing
    test costs a test's and its side's)."""
    start, end, rows, t = [], [], [], 0.0
    req = 1
    for i in range(n_gaps + 1):
        start.append(t)
        t += kernel
        end.append(t)
        tests = int(rng.integers(1, 5))
        sends = 4 if rng.random() < 0.15 else 0
        recvs = 4 if rng.random() < 0.15 else 0
        gap = (base + per_test * (tests + (sends + recvs) // 2) + per_send * sends + per_recv * recvs
               + rng.normal(0, 0.2e-6))
        at = np.linspace(t + 1e-8, t + gap - 1e-8, tests + sends + recvs)
        k = 0
        for op in (ISEND, IRECV):
            if (sends if op == ISEND else recvs):
                for _ in range(2):
                    rows.append((at[k], op, 0, req)); k += 1
                for _ in range(2):
                    rows.append((at[k], TEST, 1, req)); k += 1
                req += 1
        for _ in range(tests):
            rows.append((at[k], TEST, 0, 10**9)); k += 1
        t += gap
    calls = np.zeros(len(rows), [("t_s", "f8"), ("op", "i2"), ("flag", "i2"), ("request", "i8"), ("tid", "i4")])
    for j, (ts, op, flag, rq) in enumerate(rows):
        calls[j] = (ts, op, flag, rq, 1)
    calls = calls[np.argsort(calls["t_s"], kind="stable")]
    return calls, np.array(start), np.array(end)


def test_the_fit_finds_each_side_s_cost_per_call():
    rng = np.random.default_rng(3)
    per_send, per_recv = 0.9e-6, 1.9e-6
    c0, s0, e0 = synthetic_calls(rng, 3000, 2.5e-6, 0.4e-6, per_send, per_recv)
    c1, s1, e1 = synthetic_calls(rng, 3000, 2.5e-6, 0.4e-6, per_send, per_recv)
    shift = e0[-1] + 1e-3  # rank 1's tasks after rank 0's on one clock
    start, end = np.concatenate([s0, s1 + shift]), np.concatenate([e0, e1 + shift])
    c1 = c1.copy()
    c1["t_s"] += shift
    rank = np.repeat([0, 1], [len(s0), len(s1)])
    sent = [int(np.sum((c["op"] == ISEND))) // 2 for c in (c0, c1)]
    received = [int(np.sum((c["op"] == IRECV))) // 2 for c in (c0, c1)]
    got = fit_message_cpu([([c0, c1], start, end, rank, np.array([0.0, shift]), sent, received)])
    assert got["per_send_call_s"] == pytest.approx(per_send, rel=0.05)
    assert got["per_recv_call_s"] == pytest.approx(per_recv, rel=0.05)
    assert got["send_calls_per_message"] == pytest.approx(4.0, rel=0.01)
    assert got["recv_calls_per_message"] == pytest.approx(4.0, rel=0.01)
    assert got["message_cpu_s"] == pytest.approx(0.5 * (4 * (per_send + per_recv) + 2 * 2 * 0.4e-6), rel=0.05)
    # what recording a call cost is taken off each call's cost
    less = fit_message_cpu([([c0, c1], start, end, rank, np.array([0.0, shift]), sent, received)], 0.1e-6)
    assert less["per_send_call_s"] == pytest.approx(got["per_send_call_s"] - 0.1e-6)
    # calls that cost nothing (a negative fit) or no message at all: no figure
    assert fit_message_cpu([([c0, c1], start, end, rank, np.array([0.0, shift]), sent, received)], 5e-6) is None
    quiet = [c[c["op"] == TEST] for c in (c0, c1)]
    assert fit_message_cpu([(quiet, start, end, rank, np.array([0.0, shift]), sent, received)]) is None


@needs_mpi
def test_run_draws_the_timed_calls_in_its_trace(tmp_path, capsys):
    import json

    from tilecast.cli import main

    step = ["--model", "gpt2-tiny", "--batch", "2", "--seq", "32", "--tile", "32,batch=1"]
    assert main(["run", *step, "--mpi-calls"]) == 2  # one line, naming the flag
    assert "--mpi-calls: only with --ranks" in capsys.readouterr().err
    assert main(["run", *step, "--ranks", "2", "--mpi-calls"]) == 2
    assert "--mpi-calls: with --trace" in capsys.readouterr().err
    path = tmp_path / "t.json"
    assert main(["run", *step, "--ranks", "2", "--steps", "1", "--mpi-calls", "--trace", str(path)]) == 0
    events = json.loads(path.read_text())["traceEvents"]
    track = [e for e in events if e.get("ph") == "M" and e["name"] == "thread_name"
             and e["args"]["name"] == "MPI calls (timed)"]
    assert sorted(e["pid"] for e in track) == [0, 1]
    calls = [e for e in events if e.get("ph") == "X" and e["tid"] == track[0]["tid"]]
    names = {e["name"] for e in calls}
    assert {"MPI_Isend", "MPI_Irecv", "send done", "receive done"} <= names
    assert {e["pid"] for e in calls} == {0, 1}
    posts = [e for e in calls if e["name"] == "MPI_Isend"]
    assert all(e["args"]["tag"] in ("to rank 0", "to rank 1") and e["dur"] >= 0 for e in posts)
    # a rank posts to the other (StarPU-MPI's envelope and data) and to itself (the glue's keep-alive message)
    assert any(e["args"]["tag"] == f"to rank {1 - e['pid']}" for e in posts)


def test_not_under_an_mpirun_the_user_started(monkeypatch):
    import tilecast.executor.mpi_launch as ml
    from tilecast.errors import FieldError

    monkeypatch.setattr(ml, "under_mpirun", lambda: True)
    with pytest.raises(FieldError, match="mpi_calls: not under an mpirun you started"):
        ml.run_mpi(load_model("gpt2-tiny"), 2, 32, Tiling.parse("32,batch=1"), "lws", 1, 1, 2, "data", mpi_calls=True)
