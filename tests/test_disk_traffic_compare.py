"""The disk traffic of a memory-limited step in its trace (predicted and measured), kept in Parquet files, and
shown by tilecast compare beside each other; traces without it compare as before."""

import json

import numpy as np
import pytest
from sim_machines import cpu_machine
from test_memory_forecast import DISK, S, two_axpys

from tilecast import trace as tr
from tilecast.cli import main
from tilecast.reports import compare
from tilecast.simulator.memory_capacity import simulate_memory_limited


@pytest.fixture
def pred():
    """The by-hand eviction of tests/test_memory_forecast.py: 3 evictions, 2 write-backs, 1 dropped, 3 reads."""
    res = simulate_memory_limited(two_axpys(), cpu_machine(1), 3 * S, DISK, "eager", durations=np.full((1, 2), 1e-3),
                                  warmup=False, throttle=None)
    return tr.with_step_time(res.trace(), res.makespan)


def measured(pred, **disk):
    """A 'measured' trace of the same tasks, 10% slower, with the given disk counters."""
    real = pred[pred["task"] >= 0].copy()
    real["source"] = "real"
    real["end_s"] = real["start_s"] + 1.1 * (real["end_s"] - real["start_s"])
    real = tr.with_step_time(real, 1.1 * tr.step_time(pred))
    return tr.with_disk_counters(real, **disk) if disk else real


def test_predicted_trace_records_the_disk_counters_and_parquet_keeps_them(pred, tmp_path):
    want = {"written_bytes": 2 * S, "read_bytes": 3 * S, "writes": 2, "reads": 3, "evictions": 3, "writebacks": 2,
            "dropped": 1, "tidied": 0}
    assert tr.disk_counters(pred) == want
    assert tr.disk_counters(tr.load(tr.save(pred, str(tmp_path / "p.parquet")))) == want
    assert tr.disk_counters(tr.load(tr.save(pred, str(tmp_path / "p.csv")))) is None  # CSV: the table only
    with pytest.raises(tr.TraceError, match="unknown disk counters"):
        tr.with_disk_counters(pred, bytes_written=1)


def test_compare_shows_disk_traffic_predicted_vs_measured(pred, tmp_path, capsys):
    p = tr.save(pred, str(tmp_path / "pred.parquet"))
    r = tr.save(measured(pred, written_bytes=4 * S, read_bytes=3 * S, writes=4, reads=3), str(tmp_path / "real.parquet"))
    out = str(tmp_path / "report")
    assert main(["compare", p, r, "--out", out, "--no-chrome", "--json"]) == 0
    rows = {row["counter"]: row for row in json.loads(capsys.readouterr().out)["disk"]["rows"]}
    assert (rows["writes"]["pred"], rows["writes"]["real"], rows["writes"]["error"]) == (2, 4, -0.5)
    assert (rows["read_bytes"]["pred"], rows["read_bytes"]["real"], rows["read_bytes"]["error"]) == (3 * S, 3 * S, 0.0)
    assert (rows["evictions"]["pred"], rows["evictions"]["real"], rows["evictions"]["error"]) == (3, None, None)
    assert main(["compare", p, r, "--out", out, "--no-chrome"]) == 0
    text = capsys.readouterr().out
    line = next(ln for ln in text.splitlines() if ln.startswith("transfers to disk"))
    assert line.split()[-3:] == ["2", "4", "-50.0%"], line
    assert "not recorded" in text
    page = open(f"{out}/report.html").read()
    assert "Disk traffic per step" in page and "<td>64.00 KiB</td>" in page  # 4 tiles of 16 KiB measured


def test_traces_without_disk_counters_compare_as_before(pred):
    plain = pred.copy()
    plain.attrs = {k: v for k, v in pred.attrs.items() if k != "disk"}
    assert "disk" not in compare(plain, measured(plain)).summary()
    # one side recording them is enough for the section; the other's figures are unknown
    rows = compare(pred, measured(plain)).summary()["disk"]["rows"]
    assert all(row["real"] is None for row in rows) and rows[0]["pred"] == 2
