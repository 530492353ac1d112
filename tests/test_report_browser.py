"""The HTML report opens in a browser on its own: headless Chromium, offline, renders its charts and tables.

Chromium is the Debian package ``chromium`` (``./install.sh test`` installs it);
without it the test is skipped, saying so.
"""

import os
import re
import shutil
import subprocess

import pytest

from synthetic_traces import schedule
from tilecast.reports import compare

BROWSER = next((shutil.which(b) for b in ("chromium", "chromium-browser") if shutil.which(b)), None)
WIDTH, HEIGHT = 1400, 2400


def _no_browser():
    reason = "chromium is not installed (./install.sh test installs the Debian package chromium)"
    print(f"skipped: {reason}")
    pytest.skip(reason)


def _chromium(tmp_path, *args) -> subprocess.CompletedProcess:
    if BROWSER is None:
        _no_browser()
    profile = tmp_path / "profile"  # a fresh profile: nothing cached, no first-run state
    cmd = [BROWSER, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars", "--no-first-run",
           "--disable-extensions", "--disable-background-networking", f"--user-data-dir={profile}",
           # no network: a page that fetched anything (a CDN script, a web font) would fail to load it here
           "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90,
                          env={**os.environ, "HOME": str(tmp_path)})


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    pred, real = schedule("sim"), schedule("real", {"gemm": 1.2})
    paths = compare(pred, real, before=schedule("sim", {"gemm": 0.8})).write(str(folder))
    return paths


def test_page_references_nothing_outside_its_folder(report):
    with open(report["html"], encoding="utf-8") as f:
        page = f.read()
    assert "<script" not in page and "@import" not in page and "url(" not in page
    for src in re.findall(r'\bsrc="([^"]+)"', page):
        assert src.startswith("data:image/png;base64,"), src[:80]
    for href in re.findall(r'\bhref="([^"]+)"', page):  # links to the files beside it
        assert "://" not in href and not href.startswith("//"), href
        assert os.path.exists(os.path.join(os.path.dirname(report["html"]), href)), href


def test_rendered_dom_holds_charts_and_tables(report, tmp_path):
    r = _chromium(tmp_path, "--dump-dom", "file://" + os.path.abspath(report["html"]))
    dom = r.stdout
    assert r.returncode == 0 and "<h1>Prediction vs measurement</h1>" in dom, r.stderr[-2000:]
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,', dom)
    assert images == ["Gantt chart", "error by kernel"]
    for heading in ("Top differences", "Where the prediction went wrong: kernels", "Before and after recalibration"):
        assert heading in dom, heading
    assert "<td>gemm</td>" in dom


def test_screenshot_shows_the_charts(report, tmp_path):
    import matplotlib.image as mpimg
    import numpy as np

    shot = tmp_path / "report.png"
    r = _chromium(tmp_path, f"--screenshot={shot}", f"--window-size={WIDTH},{HEIGHT}",
                  "file://" + os.path.abspath(report["html"]))
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    img = mpimg.imread(str(shot))
    assert img.shape[:2] == (HEIGHT, WIDTH)
    ink = img[..., :3].min(axis=-1) < 0.85  # not white or the pale table and figure borders
    colour = (img[..., :3].max(axis=-1) - img[..., :3].min(axis=-1)) > 0.25  # saturated: the charts' bars
    # the charts come right after the headline figures, within the first screen; the text alone is
    # black on white, so saturated pixels can only come from the decoded, drawn PNGs
    top = slice(0, HEIGHT // 2)
    assert ink[top].mean() > 0.03, f"{ink[top].mean():.4f} of the upper half drawn"
    assert colour[top].mean() > 0.005, f"{colour[top].mean():.4f} of the upper half in colour"
    rows = np.flatnonzero(colour.any(axis=1))
    assert rows.size and rows.max() - rows.min() > HEIGHT // 4  # two charts, one above the other
