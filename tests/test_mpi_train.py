"""tilecast train --ranks: training on StarPU-MPI ranks, each checkpointing its own shards; resuming repeats the
losses of an uninterrupted run."""

import json
import shutil

import pytest

from json_keys import assert_documented

from tilecast.cli import main

pytestmark = pytest.mark.skipif(not shutil.which("mpirun"), reason="Open MPI's mpirun is not installed "
                                "(apt-get install openmpi-bin libopenmpi-dev)")

TRAIN = ["train", "--model", "gpt2-tiny", "--batch", "2", "--seq", "32", "--tile", "32,batch=1", "--ranks", "2",
         "--distribution", "layer", "--sched", "eager", "--json"]


def train_json(capsys, *args):
    rc = main([*TRAIN, *args])
    out = capsys.readouterr().out
    return rc, json.loads(out) if rc == 0 else out


def test_train_ranks_checkpoint_and_resume(capsys, tmp_path):
    ck = tmp_path / "ck"
    rc, first = train_json(capsys, "--steps", "2", "--checkpoint", str(ck))
    assert rc == 0 and len(first["losses"]) == 2
    assert_documented("train --ranks", [first])  # every key, nested ones too, in docs/cli.md, and only those
    manifest = json.loads((ck / "manifest.json").read_text())
    assert manifest["step"] == 2 and [s["rank"] for s in manifest["shards"]] == [0, 1]
    assert sorted(p.name for p in ck.iterdir()) == ["manifest.json", "rank0-step2.npz", "rank1-step2.npz"]
    assert all(s["tiles"] > 0 for s in manifest["shards"])  # each rank holds some of the parameters
    rc, resumed = train_json(capsys, "--steps", "3", "--checkpoint", str(ck), "--resume")
    assert rc == 0 and resumed["start_step"] == 2 and len(resumed["losses"]) == 1
    assert sorted(p.name for p in ck.iterdir()) == ["manifest.json", "rank0-step3.npz", "rank1-step3.npz"]
    rc, whole = train_json(capsys, "--steps", "3")
    assert rc == 0 and whole["losses"][:2] == first["losses"]
    assert resumed["losses"][0] == pytest.approx(whole["losses"][2], rel=1e-6)
    # another run's settings: refused in one line, nothing started
    rc = main([*TRAIN, "--steps", "4", "--checkpoint", str(ck), "--resume", "--lr", "1e-2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "run settings differ: lr=" in err[0]
