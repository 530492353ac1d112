"""tilecast calibrate --ranks: a ping-pong between StarPU-MPI ranks, stored and used by simulate --ranks."""

import functools
import json
import os
import shutil

import pytest

from json_keys import assert_documented

from tilecast.cli import main
from tilecast.executor.mpi_threads import progress_drives_worker

pytestmark = pytest.mark.skipif(not shutil.which("mpirun"), reason="Open MPI's mpirun is not installed "
                                "(apt-get install openmpi-bin libopenmpi-dev)")


def test_pingpong_is_stored_and_used(capsys, tmp_path, monkeypatch):
    import tilecast.loop.ranks_probe as rp
    import tilecast.perfmodel.network as rn

    monkeypatch.setattr(rn, "_path", lambda machine: str(tmp_path / "network.json"))  # not this home's own fit
    # the probe step on the smallest step, one run of two steps (about 3 s), so its object's keys are checked too
    small = dict(model="gpt2-tiny", batch=2, seq=32, tile="32,batch=1", distribution="data", sched="lws")
    monkeypatch.setattr(rp, "PROBE", small)
    monkeypatch.setattr(rp, "probe_network", functools.partial(rp.probe_network, steps=2, repeats=1))
    sim = ["simulate", "--model", "gpt2-tiny", "--batch", "2", "--seq", "32", "--tile", "32,batch=1", "--ranks", "2",
           "--distribution", "layer", "--json"]
    assert main(sim) == 2  # no network stored yet: one line saying how to measure it
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run tilecast calibrate --ranks 2" in err[0]
    assert main(["calibrate", "--ranks", "2", "--sizes", "8,65536,262144", "--round-trips", "5", "--json"]) == 0
    net = json.loads(capsys.readouterr().out)
    # every key, nested ones too (the probe's), in docs/cli.md, and only those
    assert_documented("calibrate --ranks", [net])
    probe = net["probe"]
    assert {k: probe[k] for k in small} == small and probe["ranks"] == 2 and probe["steps"] == 2
    assert len(probe["runs_s"]) == 1 and probe["step_s"] == probe["runs_s"][0] > 0
    assert probe["predicted_with_pingpong_s"] > 0 and probe["message_s_pingpong"] == net["message_s"]
    assert probe["message_s_fitted"] >= probe["message_s_pingpong"]  # bisected upwards from the ping-pong's cost
    assert net["submit_task_s"] == probe["submit_task_s"] > 0 and net["submit_cpu_task_s"] > 0
    # the worker's CPU per message, from its MPI calls' times where the fit holds (on this small probe's some
    # 1,600 gaps a cost per call may come out under what timing it costs: then the gaps' medians)
    calls = probe["message_cpu_calls"]
    if calls is not None:
        assert probe["message_cpu_from"] == "mpi calls" and probe["message_cpu_s"] == calls["message_cpu_s"] > 0
        assert calls["send_side_s"] > 0 and calls["recv_side_s"] > 0 and calls["gaps"] > 0
    elif progress_drives_worker(2, 1, os.cpu_count()):
        assert probe["message_cpu_from"] == "gap medians"
        assert probe["message_cpu_s"] == probe["message_cpu_gap_medians_s"]
    assert net["ranks"] == 2 and net["bandwidth_Bps"] > 0 and net["latency_s"] >= 0 and net["message_s"] >= 0
    assert [p[0] for p in net["points"]] == [8, 65536, 262144]
    assert all(p[1] > 0 and p[2] > 0 for p in net["points"])  # one-way times through StarPU-MPI and MPI
    assert "Open MPI" in net["transport"] or "MPI" in net["transport"]
    assert main(sim) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["network"]["message_s"] == pytest.approx(net["message_s"]) and out["messages"] > 0
