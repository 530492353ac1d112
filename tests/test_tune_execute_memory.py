"""tune --execute under --memory-limit: the chosen configuration runs under the limit with a disk node, and the
measured step time and disk traffic are put beside the forecast (table, --json, the --out report's disk section)."""

import json

import numpy as np
import pytest

from tilecast.cli import main
from tilecast.executor.memory_limit import MIB, minimum_bytes, tile_bytes
from tilecast.graph import Tiling
from tilecast.graph.model_config import load_model
from tilecast.graph.models import build_step
from tilecast.loop.tune import starpu_policies

from loop_home import loop_home, loop_home_dir  # noqa: F401

pytestmark = pytest.mark.skipif(starpu_policies() is None, reason="StarPU or the C kernels are not available here")

# the shapes tests/test_loop_end_to_end.py calibrates in the shared loop home: 2.98 MiB of tiles, a
# 2 MiB limit (the smallest working set is 1.16 MiB)
BATCH, SEQ, TILE = 2, 32, "64"


def test_tune_execute_runs_the_pick_under_the_limit(loop_home, tmp_path, capsys):  # noqa: F811
    graph = build_step(load_model("gpt2-tiny"), BATCH, SEQ, Tiling.parse(TILE))
    limit = -(-minimum_bytes([graph], 2, offload=True) // MIB) * MIB
    assert tile_bytes([graph]) > limit  # tiles must go to disk in every step
    offload, report = tmp_path / "offload", tmp_path / "report"
    offload.mkdir()
    argv = ["tune", "--model", "gpt2-tiny", "--batch", str(BATCH), "--seq", str(SEQ), "--tiles", TILE,
            "--scheds", "eager", "--workers", "2", "--recompute", "none", "--memory-limit", str(limit),
            "--offload-dir", str(offload), "--execute", "1", "--others", "0", "--steps", "2", "--warmup", "1"]
    assert main([*argv, "--out", str(report), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = doc["executed"]
    assert row["rank"] == 1 and len(row["real_steps_s"]) == 3 and row["warmup_steps"] == 1
    assert row["real_step_s"] == pytest.approx(float(np.median(row["real_steps_s"][1:])))
    assert row["error"] == pytest.approx((row["pred_step_s"] - row["real_step_s"]) / row["real_step_s"])
    for what in ("disk_written_bytes", "disk_read_bytes", "disk_writes", "disk_reads"):
        assert row[f"pred_{what}"] > 0 and row[f"real_{what}"] > 0, (what, row)
    assert row["peak_rss_bytes"] > 0
    # the report of the pick compares its forecast with its last measured step, disk traffic included
    rows = {r["counter"]: r for r in json.load(open(doc["report"]["summary_json"]))["disk"]["rows"]}
    assert rows["writes"]["pred"] == row["pred_disk_writes"] and rows["writes"]["real"] > 0
    assert rows["evictions"]["pred"] > 0 and rows["evictions"]["real"] is None
    assert "Disk traffic per step" in open(doc["report"]["html"]).read()
    assert not list(offload.iterdir())  # StarPU removed its files


def test_tune_execute_with_a_limit_refuses_recalibrate(loop_home, tmp_path, capsys):  # noqa: F811
    rc = main(["tune", "--model", "gpt2-tiny", "--batch", str(BATCH), "--seq", str(SEQ), "--tiles", TILE,
               "--memory-limit", "8MiB", "--offload-dir", str(tmp_path), "--execute", "1", "--recalibrate"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--recalibrate" in err[0] and "--memory-limit" in err[0], err
