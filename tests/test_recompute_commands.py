"""--recompute on the commands that build a step: graph compares the settings, verify and run --check agree."""

import json
import subprocess
import sys

import pytest

from tilecast.cli import main


def test_graph_compares_the_settings(capsys):
    argv = ["graph", "--model", "llama-tiny", "--batch", "2", "--seq", "64", "--tile", "16"]
    assert main(argv + ["--recompute", "selective", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["recompute_settings"]
    assert out["recompute"] == "selective" and list(rows) == ["none", "selective", "full"]
    assert rows["selective"]["tasks"] == out["tasks"] and rows["selective"]["live_bytes"] == out["live_bytes"]
    assert rows["none"]["live_bytes"] > rows["selective"]["live_bytes"] > rows["full"]["live_bytes"]
    assert rows["none"]["tasks"] < rows["selective"]["tasks"] < rows["full"]["tasks"]
    assert out["live_bytes"] == out["live_persistent_bytes"] + out["live_activation_bytes"]
    assert main(argv + ["--recompute", "full"]) == 0
    text = capsys.readouterr().out
    assert "recompute full" in text and "<- this graph" in text.splitlines()[-1]
    assert main(argv + ["--recompute", "full", "--no-compare", "--json"]) == 0
    assert list(json.loads(capsys.readouterr().out)["recompute_settings"]) == ["full"]


@pytest.mark.parametrize("command", ["graph", "verify", "run", "simulate", "tune"])
def test_bad_setting_is_one_line_exit_2(command):
    p = subprocess.run([sys.executable, "-m", "tilecast", command, "--model", "gpt2-tiny", "--seq", "16",
                        "--recompute", "most"], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.strip() == (f"tilecast {command}: --recompute: must be one of none, selective, full, "
                                f"got 'most'")


def test_verify_full_recompute_against_transformers(capsys):
    pytest.importorskip("torch", reason="torch is the numeric reference; install tilecast[test]")
    pytest.importorskip("transformers", reason="transformers is the numeric reference; install tilecast[test]")
    for model, tile in (("gpt2-tiny", "batch=1,seq=5,embd=24,head=3,inner=100,vocab=60"),
                        ("llama-tiny", "batch=1,seq=5,embd=24,head=2,inner=100,vocab=60")):
        assert main(["verify", "--model", model, "--batch", "2", "--seq", "16", "--tile", tile,
                     "--recompute", "full", "--json"]) == 0, model
        assert json.loads(capsys.readouterr().out)["ok"]


def test_starpu_run_with_full_recompute_matches_the_run_without(capsys):
    """Same kernels on the same inputs in the same accumulation order: two StarPU steps (the second depends
    on the first's gradients through AdamW) give the same losses bit for bit, and --check passes."""
    from tilecast.executor.starpu_run import run_steps
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model

    cfg, tiling = load_model("gpt2-tiny"), Tiling.parse("batch=1,seq=5,embd=24,head=3,inner=100,vocab=60")
    runs = {s: run_steps(cfg, 2, 16, tiling, "dmda", 2, 2, check=True, recompute=s) for s in ("none", "full")}
    assert runs["full"].n_tasks > runs["none"].n_tasks
    for s, r in runs.items():
        assert r.check["ok"], (s, r.check)
    assert runs["full"].losses == runs["none"].losses
    assert main(["run", "--model", "llama-tiny", "--batch", "2", "--seq", "16", "--tile", "8", "--workers", "2",
                 "--steps", "1", "--recompute", "selective", "--check", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["recompute"] == "selective" and out["check"]["ok"]


def test_training_with_full_recompute_repeats_the_losses(capsys):
    from tilecast.training.loop import TrainOptions, train
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model

    base = dict(cfg=load_model("gpt2-tiny"), batch=2, seq=16, tiling=Tiling.parse("8"), steps=4, workers=2,
                sched="lws", eval_every=2, eval_batches=1, seed=1)
    runs = {s: train(TrainOptions(**base, recompute=s), log=lambda line: None) for s in ("none", "full")}
    assert runs["full"].n_tasks > runs["none"].n_tasks
    assert runs["full"].losses == runs["none"].losses and runs["full"].val == runs["none"].val
    assert main(["train", "--recompute", "al"]) == 2
    assert "--recompute: must be one of" in capsys.readouterr().err
