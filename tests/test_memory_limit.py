"""Memory-limited runs: StarPU-managed tiles evicted to a disk node give the unlimited run's results
exactly; a limit below the smallest working set and unusable offload directories are refused in one line
before anything runs, and no checkpoint is lost."""

import hashlib
import json
import os
import subprocess

import numpy as np
import pytest

from tilecast.cli import main
from tilecast.data.checkpoint import load_checkpoint
from tilecast.executor.managed_tiles import ManagedTileStore
from tilecast.executor.memory_limit import (MIB, MemoryLimit, MemoryLimitError, check_direct_io, minimum_bytes,
                                            parse_size, tile_bytes)
from tilecast.executor.starpu_run import StarPUTraining, run_steps
from tilecast.executor.starpu_session import StarPUSession, disk_files
from tilecast.reference.step import TrainState, init_params
from tilecast.training.loop import TrainOptions, train
from tilecast.graph import Tiling
from tilecast.graph.gpt2 import AdamWConfig, adam_names, grad_name
from tilecast.graph.model_config import load_model
from tilecast.graph.models import build_step
from tilecast.trace import disk_counters as trace_disk

# gpt2-tiny, batch 4 x 128 at tile 32: 13 MiB of tiles, largest task 0.25 MiB; a 2 MiB limit evicts most
# tiles to disk in every step.
CFG = load_model("gpt2-tiny")
BATCH, SEQ, TILE = 4, 128, "32"
TIGHT = 2 * MIB


def test_parse_size_units_and_errors():
    assert parse_size("12GiB") == 12 << 30
    assert parse_size("512MiB") == 512 << 20
    assert parse_size("1.5GB") == 1_500_000_000
    assert parse_size("4096") == 4096
    for bad in ("12XB", "", "-1GiB", "0", "GiB"):
        with pytest.raises(MemoryLimitError, match="^memory_limit: "):
            parse_size(bad)


def test_smallest_working_set():
    graph = build_step(CFG, BATCH, SEQ, Tiling.parse(TILE), AdamWConfig())
    assert minimum_bytes([graph], 2, offload=False) == tile_bytes([graph])
    with_disk = minimum_bytes([graph], 2, offload=True)
    assert TIGHT >= with_disk and minimum_bytes([graph], 4, offload=True) > with_disk
    with pytest.raises(MemoryLimitError, match=r"minimum is \d+MiB"):
        MemoryLimit(TIGHT).check([graph], 2)  # no disk node: every tile must fit


def one_step(memory, offload=None):
    """Loss, gradients and updated parameters of one step (and the disk traffic of it)."""
    graph = build_step(CFG, BATCH, SEQ, Tiling.parse(TILE), AdamWConfig())
    state = TrainState(init_params(CFG, 3))
    data = np.random.default_rng(3).integers(0, CFG.vocab_size, size=(1, BATCH, SEQ + 1))
    with StarPUSession("eager", 2, memory=memory) as s:
        training = StarPUTraining(s, graph, state, data)
        assert isinstance(training.store, ManagedTileStore) == (memory is not None)
        s.disk_traffic()
        _, loss, _ = training.step(trace=False)
        written, read = s.disk_traffic()
        store = training.store
        grads = {n: store.tensor(grad_name(n)) for n in state.params}
        params = {n: store.tensor(n) for n in state.params}
        moments = {n: store.tensor(adam_names(n)[1]) for n in state.params}
    return loss, grads, params, moments, written, read


def test_limited_step_evicts_to_disk_and_equals_the_unlimited_step(tmp_path):
    free = one_step(None)
    limited = one_step(MemoryLimit(TIGHT, str(tmp_path)))
    written, read = limited[4:]
    assert written > 4 * MIB and read > 4 * MIB, (written, read)  # StarPU's bus counters, RAM <-> disk node
    assert limited[0] == free[0]
    for i in (1, 2, 3):
        for name in free[i]:
            np.testing.assert_array_equal(limited[i][name], free[i][name], err_msg=name)
    assert not os.listdir(tmp_path)  # StarPU removes its files when it stops


def test_direct_offload_io_equals_the_unlimited_step(tmp_path):
    """--offload-io direct: the tiles of whole pages (32 x 32 float32) go to files opened with O_DIRECT, the
    others (a 32-float bias) to buffered ones; the step's results are the unlimited step's, bit for bit."""
    free = one_step(None)
    before = disk_files()
    limited = one_step(MemoryLimit(TIGHT, str(tmp_path), "direct"))
    after = disk_files()
    assert after["direct"] > before["direct"] and after["buffered"] > before["buffered"], (before, after)
    written, read = limited[4:]
    assert written > 4 * MIB and read > 4 * MIB, (written, read)
    assert limited[0] == free[0]
    for i in (1, 2, 3):
        for name in free[i]:
            np.testing.assert_array_equal(limited[i][name], free[i][name], err_msg=name)
    assert not os.listdir(tmp_path)


def test_offload_io_is_checked(tmp_path, monkeypatch):
    with pytest.raises(MemoryLimitError, match="^offload_io: 'odirect' is not one of buffered, direct"):
        MemoryLimit(TIGHT, "/tmp", "odirect")
    check_direct_io(str(tmp_path))  # this file system takes O_DIRECT (the test above ran on it)
    assert not os.listdir(tmp_path)
    monkeypatch.delattr(os, "O_DIRECT")
    with pytest.raises(MemoryLimitError, match=r"^offload_io: .* does not take O_DIRECT \(this system has no O_DIRECT\); "
                                               "use buffered$"):
        MemoryLimit(TIGHT, str(tmp_path), "direct").check([build_step(CFG, BATCH, SEQ, Tiling.parse(TILE),
                                                                      AdamWConfig())], 2)


def test_run_steps_write_to_disk_every_step_and_repeat_the_losses(tmp_path):
    kw = dict(steps=2, seed=1, workers=2, sched="eager")
    free = run_steps(CFG, BATCH, SEQ, Tiling.parse(TILE), **kw)
    limited = run_steps(CFG, BATCH, SEQ, Tiling.parse(TILE), memory=MemoryLimit(TIGHT, str(tmp_path)), **kw)
    assert limited.losses == free.losses
    assert all(w > 4 * MIB for w in limited.disk_written), limited.disk_written
    assert all(r > 4 * MIB for r in limited.disk_read), limited.disk_read
    assert free.disk_written == [0, 0]
    # the transfers behind the bytes: one per tile moved, none larger than the largest tile
    largest = int(np.max(limited.graph.tile_nbytes))
    for n, b in zip(limited.disk_writes + limited.disk_reads, limited.disk_written + limited.disk_read):
        assert n > 0 and n * largest >= b, (n, b, largest)
    # the last step's trace records its disk traffic (tilecast compare shows it); the unlimited one none
    assert trace_disk(limited.trace) == {"written_bytes": limited.disk_written[-1], "read_bytes": limited.disk_read[-1],
                                         "writes": limited.disk_writes[-1], "reads": limited.disk_reads[-1]}
    assert trace_disk(free.trace) is None


def run_cli(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_too_small_limit_is_refused_in_one_line(tmp_path, capsys):
    rc, out, err = run_cli(["run", "--batch", str(BATCH), "--seq", str(SEQ), "--tile", "64", "--workers", "2", "--sched", "eager",
                            "--memory-limit", "1MiB", "--offload-dir", str(tmp_path)], capsys)
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    graph = build_step(CFG, BATCH, SEQ, Tiling.parse("64"), AdamWConfig())
    need = -(-minimum_bytes([graph], 2, offload=True) // MIB)
    assert need > 1
    assert len(lines) == 1 and "--memory-limit" in lines[0] and f"minimum is {need}MiB" in lines[0], err


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def mounted(tmp_path, name, options):
    """A tmpfs mounted with ``options`` (needs root); None where it cannot be mounted."""
    d = tmp_path / name
    d.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(d)], capture_output=True)
    return d if res.returncode == 0 else None


def unmount(d):
    subprocess.run(["umount", str(d)], capture_output=True)


TRAIN = ["train", "--batch", "4", "--seq", "64", "--tile", "32", "--workers", "2", "--eval-every", "2",
         "--eval-batches", "1", "--sched", "eager"]


def test_bad_offload_dirs_refused_in_one_line_and_no_checkpoint_lost(tmp_path, capsys):
    ck = str(tmp_path / "ck.npz")
    rc, _, _ = run_cli([*TRAIN, "--steps", "1", "--checkpoint", ck, "--json"], capsys)
    assert rc == 0
    before = sha(ck)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    cases = {"missing": (str(tmp_path / "nope"), "no such directory"), "file": (str(a_file), "not a directory")}
    ro = mounted(tmp_path, "ro", "ro,size=1m")
    if ro is None and os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir(exist_ok=True)
        ro.chmod(0o555)
    full = mounted(tmp_path, "full", "size=1m")
    try:
        if ro is not None:
            cases["read-only"] = (str(ro), "cannot write")
        else:
            print("read-only offload directory not tested: running as root and tmpfs cannot be mounted here")
        if full is not None:
            cases["full"] = (str(full), "free, the run may evict up to")
        else:
            print("full offload directory not tested: a 1 MiB tmpfs cannot be mounted here (needs root)")
        for what, (d, why) in cases.items():
            rc, out, err = run_cli([*TRAIN, "--steps", "2", "--checkpoint", ck, "--resume", "--memory-limit", "2MiB",
                                    "--offload-dir", d, "--json"], capsys)
            lines = err.strip().splitlines()
            assert rc == 2 and out == "" and len(lines) == 1, (what, err)
            assert "--offload-dir" in lines[0] and why in lines[0], (what, err)
            assert sha(ck) == before, what
    finally:
        for d in (ro, full):
            if d is not None and os.path.ismount(d):
                unmount(d)


def test_train_limited_resumes_with_the_unlimited_losses(tmp_path, capsys):
    free_ck = str(tmp_path / "free.npz")
    rc, out, _ = run_cli([*TRAIN, "--steps", "3", "--checkpoint", free_ck, "--json"], capsys)
    assert rc == 0
    straight = json.loads(out)
    assert straight["memory_limit_bytes"] is None and straight["peak_rss_bytes"] > 0
    ck = str(tmp_path / "ck.npz")
    limit = ["--memory-limit", "2MiB", "--offload-dir", str(tmp_path), "--checkpoint", ck, "--json"]
    rc, out, _ = run_cli([*TRAIN, "--steps", "1", *limit], capsys)
    assert rc == 0 and json.loads(out)["losses"] == straight["losses"][:1]
    rc, out, _ = run_cli([*TRAIN, "--steps", "3", "--resume", *limit], capsys)
    resumed = json.loads(out)
    assert rc == 0 and resumed["start_step"] == 1
    assert resumed["losses"] == straight["losses"]
    assert resumed["memory_limit_bytes"] == 2 * MIB and resumed["peak_rss_bytes"] > 0
    # the checkpoint written from StarPU's tiles one tensor at a time holds the unlimited run's state exactly
    a, b = load_checkpoint(free_ck), load_checkpoint(ck)
    for group in ("params", "adam_m", "adam_v"):
        for name, want in getattr(a, group).items():
            np.testing.assert_array_equal(getattr(b, group)[name], want, err_msg=f"{group} {name}")
    steps = {v["step"] for v in straight["val_losses"]}  # the first run also evaluated at its last step, 1
    assert [v for v in resumed["val_losses"] if v["step"] in steps] == straight["val_losses"]


def test_train_limit_checks_the_forward_graph_too():
    o = TrainOptions(cfg=CFG, batch=4, seq=64, tiling=Tiling.parse("32"), steps=1, workers=2, eval_every=1,
                     eval_batches=1, memory=MemoryLimit(1 * MIB))
    with pytest.raises(MemoryLimitError, match="every tile stays in memory"):
        train(o, log=lambda line: None)
