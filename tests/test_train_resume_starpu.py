"""tilecast train on StarPU (GPT-2 and Llama): Ctrl-C writes a checkpoint, --resume repeats the uninterrupted
losses exactly, and a damaged or mismatched checkpoint stops with one line (exit 2)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tilecast.cli import main
from tilecast.data.checkpoint import load_checkpoint
from tilecast.training.loop import TrainOptions, train
from tilecast.graph import Tiling
from tilecast.graph.model_config import load_model
from tilecast.graph.models import model_parameters

SHAPE = ["--batch", "2", "--seq", "16", "--tile", "8", "--workers", "2", "--eval-batches", "2"]


def cli(argv, capsys):
    rc = main(["train", *SHAPE, *argv, "--json"])
    out, err = capsys.readouterr()
    return rc, out, err


def options(**kw):
    base = dict(cfg=load_model("gpt2-tiny"), batch=2, seq=16, tiling=Tiling.parse("8"), steps=8, workers=2,
                sched="lws", eval_every=4, eval_batches=2, seed=1)
    return TrainOptions(**{**base, **kw})


@pytest.mark.parametrize("model", ["gpt2-tiny", "llama-tiny"])
def test_sigint_checkpoint_and_resume_repeat_the_uninterrupted_losses(model, tmp_path):
    quiet = lambda line: None  # noqa: E731
    cfg = load_model(model)
    straight = train(options(cfg=cfg), log=quiet)
    assert straight.losses[-1] < straight.losses[0]

    path = str(tmp_path / "ck.npz")

    def ctrl_c_at_step_3(step, *_):
        if step == 3:
            os.kill(os.getpid(), signal.SIGINT)  # as a terminal's Ctrl-C: handled after the step in flight

    first = train(options(cfg=cfg, checkpoint=path), progress=ctrl_c_at_step_3, log=quiet)
    assert first.interrupted and first.step == 3 and first.checkpoints == [(3, path)]
    saved = load_checkpoint(path)
    assert saved.step == 3 and set(saved.params) == set(model_parameters(cfg))
    resumed = train(options(cfg=cfg, checkpoint=path, resume=True), log=quiet)
    assert resumed.start_step == 3 and resumed.step == 8
    assert resumed.losses == straight.losses  # bit for bit
    assert [v for s, v in resumed.val if s in (4, 8)] == [v for s, v in straight.val if s in (4, 8)]


def test_cli_json_interrupt_exit_130_and_resume(tmp_path, capsys):
    path = str(tmp_path / "ck.npz")
    rc, out, _ = cli(["--steps", "6", "--eval-every", "3"], capsys)
    assert rc == 0
    straight = json.loads(out)
    assert straight["steps"] == 6 and len(straight["losses"]) == 6 and not straight["interrupted"]
    assert [v["step"] for v in straight["val_losses"]] == [0, 3, 6]
    assert straight["final_train_loss"] == straight["losses"][-1] and straight["tokens_per_s"] > 0
    assert straight["wall_s"] >= straight["step_time_s"] > 0

    # a real process, stopped with SIGINT once its first periodic checkpoint exists
    cmd = [sys.executable, "-m", "tilecast", "train", *SHAPE, "--steps", "100000", "--eval-every", "0",
           "--checkpoint", path, "--checkpoint-every", "2", "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-500:]
    stopped = json.loads(out)
    assert stopped["interrupted"] and f"interrupted at step {stopped['steps']}" in err
    saved = load_checkpoint(path)
    assert saved.step == stopped["steps"] >= 2

    target = saved.step + 2
    rc, out, _ = cli(["--steps", str(target), "--eval-every", "0"], capsys)
    assert rc == 0
    want = json.loads(out)["losses"]
    rc, out, _ = cli(["--steps", str(target), "--eval-every", "0", "--checkpoint", path, "--resume"], capsys)
    assert rc == 0
    resumed = json.loads(out)
    assert resumed["start_step"] == saved.step and resumed["losses"] == want


@pytest.fixture(scope="module")
def checkpoint_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("train") / "ck.npz")
    assert main(["train", *SHAPE, "--steps", "2", "--eval-every", "0", "--checkpoint", path, "--json"]) == 0
    return path


def one_line_error(capsys, argv):
    rc, out, err = cli(argv, capsys)
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tilecast train: ")
    return lines[0]


def test_corrupted_checkpoint_is_an_error_not_a_restart(checkpoint_file, tmp_path, capsys):
    data = bytearray(open(checkpoint_file, "rb").read())
    for at in (len(data) // 3, len(data) // 2):
        data[at] ^= 0xFF
    bad = tmp_path / "bad.npz"
    bad.write_bytes(bytes(data))
    line = one_line_error(capsys, ["--steps", "4", "--checkpoint", str(bad), "--resume"])
    assert "corrupted" in line
    bad.write_bytes(bytes(data[: len(data) // 2]))
    assert "corrupted" in one_line_error(capsys, ["--steps", "4", "--checkpoint", str(bad), "--resume"])
    missing = str(tmp_path / "none.npz")
    assert "no such file" in one_line_error(capsys, ["--steps", "4", "--checkpoint", missing, "--resume"])


def test_mismatched_checkpoint_and_bad_options(checkpoint_file, capsys):
    other = '{"n_layer": 1, "n_embd": 64, "n_head": 4, "vocab_size": 256, "n_positions": 128}'
    line = one_line_error(capsys, ["--model", other, "--steps", "4", "--checkpoint", checkpoint_file, "--resume"])
    assert "n_layer=2 in the checkpoint, 1 requested" in line
    line = one_line_error(capsys, ["--model", "llama-tiny", "--steps", "4", "--checkpoint", checkpoint_file,
                                   "--resume"])
    assert "model shape differs" in line and "family=None in the checkpoint, llama requested" in line
    line = one_line_error(capsys, ["--lr", "0.01", "--steps", "4", "--checkpoint", checkpoint_file, "--resume"])
    assert "run settings differ" in line and "lr" in line
    line = one_line_error(capsys, ["--model", "gpt2", "--steps", "4"])
    assert "vocab_size must be 256" in line
    assert "--resume needs a checkpoint path" in one_line_error(capsys, ["--resume"])
    assert "less than one batch of 100000 x 16" in one_line_error(capsys, ["--batch", "100000"])


def test_existing_checkpoint_needs_resume_and_divergence_stops(checkpoint_file, tmp_path, capsys):
    line = one_line_error(capsys, ["--steps", "4", "--checkpoint", checkpoint_file])
    assert line.startswith("tilecast train: --checkpoint: ") and "exists; resume from it" in line
    path = tmp_path / "diverged.npz"
    rc, out, err = cli(["--steps", "6", "--lr", "1e30", "--eval-every", "0", "--checkpoint", str(path)], capsys)
    res = json.loads(out)
    assert rc == 1 and res["diverged"] and res["steps"] < 6 and "smaller --lr" in err
    assert not path.exists()  # a diverged state is not saved
