"""tilecast run --ranks: the step on StarPU-MPI processes equals the one-process reference, moves the bytes the
insert-task model predicts, and every failure ends every process with one line."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from json_keys import assert_documented

from tilecast.cli import main
from tilecast.executor.mpi_threads import progress_drives_worker

pytestmark = pytest.mark.skipif(not shutil.which("mpirun"), reason="Open MPI's mpirun is not installed "
                                "(apt-get install openmpi-bin libopenmpi-dev)")

STEP = ["--model", "gpt2-tiny", "--batch", "2", "--seq", "32", "--tile", "32,batch=1"]


def run_json(capsys, *args):
    rc = main(["run", *STEP, "--json", *args])
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    return rc, json.loads(out)


@pytest.mark.parametrize("distribution,sched,ranks,steps", [
    ("data", "eager", 2, 2), ("layer", "dmdas", 2, 1),  # dmdas: priorities from the bottom levels
    pytest.param("cyclic", "lws", 2, 1, marks=pytest.mark.benchmark),  # opt-in (-m benchmark): the suite's time
    pytest.param("cyclic", "dmda", 4, 1, marks=pytest.mark.benchmark),  # 4 Python ranks on 2 cores: ~30 s
    pytest.param("data", "lws", 4, 1, marks=pytest.mark.benchmark)])
def test_ranks_equal_reference_and_model(capsys, tmp_path, distribution, sched, ranks, steps):
    trace = tmp_path / ("t.json" if distribution == "data" else "t.parquet")
    batch = ["--batch", str(ranks)] if distribution == "data" else []  # a batch tile per rank
    recompute = "selective" if distribution == "layer" else "none"
    rc, res = run_json(capsys, "--ranks", str(ranks), "--distribution", distribution, "--sched", sched,
                       "--steps", str(steps), "--check", "--trace", str(trace), "--recompute", recompute, *batch)
    assert rc == 0 and res["check"]["ok"], res["check"]
    assert_documented("run --ranks", [res])  # every key, nested ones too, in docs/cli.md, and only those
    assert res["recompute"] == recompute
    assert res["ranks"] == ranks and res["workers_per_rank"] == 1 and len(res["step_times_s"]) == steps
    # on a machine with fewer cores than workers and progress threads, the progress thread runs worker 0
    assert res["progress_drives_worker"] == progress_drives_worker(ranks, 1, os.cpu_count())
    # the main thread first wherever each rank's worker has a core of its own
    assert res["main_thread_first"] == (ranks <= os.cpu_count())
    # StarPU-MPI's own count of bytes sent equals the insert-task model's, rank by rank; tasks too.
    assert res["bytes_moved"] == res["bytes_moved_predicted"] > 0
    for r in res["per_rank"]:
        assert r["tasks"] == r["tasks_predicted"] > 0
        assert r["bytes_sent"] == r["bytes_sent_predicted"] and r["bytes_received"] == r["bytes_received_predicted"]
    assert sum(r["tasks"] for r in res["per_rank"]) == res["tasks"]
    if trace.suffix == ".json":  # the Chrome trace: one process per rank, the messages on tracks of their own
        events = json.loads(trace.read_text())["traceEvents"]
        assert sorted(e["args"]["name"] for e in events if e.get("name") == "process_name") == \
            [f"rank {r}" for r in range(ranks)]
        assert sum(e["args"]["bytes"] for e in events if e.get("name") == "transfer") == res["bytes_moved"]
        assert {e["args"]["name"] for e in events if e.get("name") == "thread_name"} == \
            {f"MPI from rank {r}" for r in range(ranks)}
        assert sum(1 for e in events if e.get("ph") == "X" and e["name"] != "transfer") == res["tasks"]
        return
    from tilecast.trace import load

    df = load(str(trace))
    tasks = df[df["task"] >= 0]
    assert len(tasks) == res["tasks"] and sorted(tasks["node"].unique()) == list(range(ranks))
    moved = df[df["kernel"] == "transfer"]
    assert moved["bytes"].sum() == res["bytes_moved"] and (moved["end_s"] >= moved["start_s"]).all()
    # every rank's tasks lie in its step, timed from the barrier that starts it (StarPU's clocks start at each
    # process's starpu_init: raw times of two ranks differ by their start-up times)
    step = res["step_times_s"][-1]
    assert (tasks["start_s"] >= 0).all() and (tasks["end_s"] <= step + 1e-3).all()


def test_ranks_that_do_not_fit_and_missing_mpirun(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    p = subprocess.run([sys.executable, "-m", "tilecast", "run", *STEP, "--ranks", "3", "--distribution", "layer"],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and "--ranks" in p.stderr
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").symlink_to(sys.executable)
    p = subprocess.run([sys.executable, "-m", "tilecast", "run", *STEP, "--ranks", "2"], capture_output=True,
                       text=True, env=dict(env, PATH=str(bare)))
    assert p.returncode == 1 and p.stderr.strip() == ("tilecast run: mpirun not found: install Open MPI "
                                                      "(apt-get install openmpi-bin libopenmpi-dev)")


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _start(*args):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    return subprocess.Popen([sys.executable, "-m", "tilecast", "run", *STEP, "--ranks", "2", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_a_rank_that_dies_ends_every_process():
    proc = _start("--steps", "100000")  # still running when a rank is killed 3 s in
    try:
        ranks = []
        deadline = time.time() + 60
        while len(ranks) < 2 and time.time() < deadline:
            ranks = [p for p in _descendants(proc.pid)
                     if "tilecast.executor.mpi_rank" in _cmdline(p) and "mpirun" not in _cmdline(p).split()[0]]
            time.sleep(0.2)
        assert len(ranks) == 2, "the rank processes never started"
        time.sleep(3)  # inside StarPU-MPI by now
        os.kill(ranks[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()  # its mpirun gets SIGTERM (PR_SET_PDEATHSIG)
    assert proc.returncode == 1
    assert err.strip().count("\n") == 0 and err.startswith("tilecast run: a rank failed"), err
    assert not [p for p in ranks if Path(f"/proc/{p}").exists() and "mpi_rank" in _cmdline(p)]


def test_timeout_ends_every_process():
    proc = _start("--timeout", "2", "--steps", "100000")  # 200 steps once finished within 2 s (Intel Xeon guest)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and err.strip().count("\n") == 0 and "did not finish within 2 s" in err, err
    assert not _descendants(proc.pid)


def test_under_a_user_started_mpirun():
    from tilecast.executor.mpi_launch import mpirun_command

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]),
               OMPI_MCA_btl_vader_single_copy_mechanism="none")
    p = subprocess.run(mpirun_command(2) + [sys.executable, "-m", "tilecast", "run", *STEP, "--ranks", "2",
                                            "--steps", "1", "--json"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1  # rank 0 reports, rank 1 prints nothing
    res = json.loads(lines[0])
    assert res["bytes_moved"] == res["bytes_moved_predicted"] > 0


def test_the_table_says_how_the_ranks_threads_ran(capsys):
    assert main(["run", *STEP, "--ranks", "2", "--steps", "1"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("threads: "))
    first = 2 <= os.cpu_count()  # each rank's worker has a core of its own
    assert ("main thread on its worker's core" in line) == first and ("at one level" in line) == (not first)
    assert ("runs worker 0" in line) == progress_drives_worker(2, 1, os.cpu_count())
