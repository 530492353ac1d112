"""What a memory-limited process holds beyond its limit: StarPU's record of each registered tile, the
forecast kept out of the measured process, and benchmarks/out_of_core.py's peak RSS against the formula."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tilecast.executor.managed_tiles import ManagedTileStore
from tilecast.executor.memory_limit import (HANDLE_BYTES, MIB, MemoryLimit, MemoryLimitError, current_rss_bytes,
                                            overhead_bytes)
from tilecast.executor.starpu_session import StarPUSession
from tilecast.graph import Tiling
from tilecast.graph.model_config import load_model
from tilecast.graph.models import build_step
from tilecast.loop.predict_memory import predict_limited, predicted_fields, predicted_fields_apart

CFG = load_model("gpt2-tiny")
ROOT = Path(__file__).resolve().parents[1]


def test_each_registered_tile_costs_starpu_about_handle_bytes(tmp_path):
    graph = build_step(CFG, 1, 64, Tiling.parse("8"))  # about 10,000 tiles, none allocated
    with StarPUSession("eager", 1, memory=MemoryLimit(64 * MIB, str(tmp_path))) as session:
        before = current_rss_bytes()
        store = ManagedTileStore(graph, session)
        per_tile = (current_rss_bytes() - before) / graph.n_tiles
        store.close()
    assert graph.n_tiles > 5000
    assert 0.5 * HANDLE_BYTES < per_tile < 1.5 * HANDLE_BYTES, per_tile


def test_forecast_in_a_child_process_equals_the_forecast_here(tmp_path):
    args = (CFG, 1, 32, Tiling.parse("32"), "dmda", 2, 4 * MIB, str(tmp_path))
    assert predicted_fields_apart(*args) == predicted_fields(predict_limited(*args))
    with pytest.raises(MemoryLimitError, match="minimum is"):
        predicted_fields_apart(CFG, 1, 32, Tiling.parse("32"), "dmda", 2, 1024, str(tmp_path))


def test_out_of_core_peak_rss_within_the_limit_plus_the_overhead_formula(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    limit = 2 * MIB  # the step has about 4 MiB of tiles: some go to disk in every step
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/out_of_core.py"), "--model", "gpt2-tiny",
                          "--batch", "2", "--seq", "32", "--tile", "32", "--memory-limit", str(limit),
                          "--offload-dir", str(tmp_path), "--warmup", "1", "--steps", "1"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["memory_limit_bytes"] == limit and res["disk_bytes"]["written"] > 0
    assert res["expected_overhead_bytes"] == overhead_bytes(res["tiles"], res["rss_before_start_bytes"])
    assert res["overhead_bytes"] == res["peak_rss_bytes"] - limit
    # the process's peak: at most the limit plus the formula's overhead (with a margin for the allocator)
    assert res["peak_rss_bytes"] <= limit + 1.25 * res["expected_overhead_bytes"], res
