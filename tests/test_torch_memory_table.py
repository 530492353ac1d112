"""The fit table of benchmarks/torch_memory.py: measured rows kept, others estimated, both fit rules."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import torch_memory  # noqa: E402
from tilecast.graph.model_config import load_model  # noqa: E402

GiB = 1 << 30


def test_estimates_extrapolate_the_largest_measured_overhead_and_apply_both_limits():
    p = {m: load_model(m).n_params() for m in ("gpt2", "gpt2-medium", "gpt2-xl")}
    measured = {"gpt2": 16 * p["gpt2"] + GiB, "gpt2-medium": None}
    rows = {r["model"]: r for r in torch_memory.table(["gpt2", "gpt2-medium", "gpt2-xl"], measured,
                                                      total=12 * GiB, offload_free=10 * GiB, limit=2 * GiB)}
    assert rows["gpt2"]["torch_measured"] and rows["gpt2"]["torch_peak_rss_bytes"] == 16 * p["gpt2"] + GiB
    assert not rows["gpt2-medium"]["torch_measured"]  # failed under its cap: estimated
    assert rows["gpt2-medium"]["torch_peak_rss_bytes"] == 16 * p["gpt2-medium"] + GiB
    assert rows["gpt2-medium"]["torch_fits"] and not rows["gpt2-xl"]["torch_fits"]  # 6.3 GiB vs 24 GiB of 12
    # offload holds state - limit: gpt2-medium (5.3 - 2 GiB) fits in 10 GiB, gpt2-xl (23.2 - 2 GiB) does not
    assert rows["gpt2-medium"]["tilecast_fits"] and not rows["gpt2-xl"]["tilecast_fits"]


def test_a_size_seen_failing_is_at_least_what_it_held_and_never_fits_under_a_cap_of_memtotal():
    p = load_model("gpt2-xl").n_params()
    failed = {"failed": "step 1: AdamW", "rss": 16 * p + 3 * GiB, "error": "can't allocate", "cap_bytes": 40 * GiB}
    for cap, fits in ((40 * GiB, False), (20 * GiB, True)):  # MemTotal 30 GiB: failing under 20 GiB proves nothing
        rows = torch_memory.table(["gpt2-xl"], {"gpt2-xl": None}, total=30 * GiB, offload_free=40 * GiB,
                                  limit=2 * GiB, failed={"gpt2-xl": {**failed, "cap_bytes": cap}})
        r = rows[0]
        assert not r["torch_measured"] and r["torch_failed"]["failed"] == "step 1: AdamW"
        assert r["torch_peak_rss_bytes"] == 16 * p + 3 * GiB  # above the bare estimate (no overhead measured)
        assert r["torch_fits"] is fits
