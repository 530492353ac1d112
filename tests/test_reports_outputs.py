"""The report folder: PNGs, Chrome traces, summary JSON and one self-contained HTML page."""

import json
import re

from synthetic_traces import schedule
from tilecast.reports import compare

PNG = b"\x89PNG\r\n\x1a\n"


def test_report_folder_holds_every_output(tmp_path):
    pred, real = schedule("sim"), schedule("real", {"gemm": 1.2})
    c = compare(pred, real)
    paths = c.write(str(tmp_path / "report"))
    for key in ("gantt_png", "errors_png"):
        with open(paths[key], "rb") as f:
            data = f.read()
        assert data.startswith(PNG) and len(data) > 5000, key
    for key, df in (("pred_chrome_json", pred), ("real_chrome_json", real)):
        with open(paths[key]) as f:
            events = json.load(f)["traceEvents"]
        assert sum(e["ph"] == "X" for e in events) == len(df)
    with open(paths["summary_json"]) as f:
        assert json.load(f) == json.loads(json.dumps(c.summary()))


def test_html_page_is_self_contained(tmp_path):
    paths = compare(schedule("sim"), schedule("real", {"gemm": 1.2})).write(str(tmp_path))
    with open(paths["html"], encoding="utf-8") as f:
        page = f.read()
    images = re.findall(r'<img [^>]*src="([^"]+)"', page)
    assert len(images) == 2 and all(src.startswith("data:image/png;base64,") for src in images)
    assert "-13.79%" in page  # makespan error (25 - 29) / 29
    assert "<td>gemm</td>" in page and "<td>h*/mlp</td>" in page


def test_notebook_view_renders_tables():
    html = compare(schedule("sim"), schedule("real"))._repr_html_()
    assert "<table" in html and "+0.00%" in html


def test_chrome_traces_can_be_left_out(tmp_path):
    real = schedule("real")
    paths = compare(schedule("sim"), real).write(str(tmp_path), chrome=False)
    assert "pred_chrome_json" not in paths and not (tmp_path / "pred.trace.json").exists()
    with open(paths["html"], encoding="utf-8") as f:
        assert "Perfetto" not in f.read()
