"""One self-contained HTML page for a comparison: figures, tables, plots as base64 images."""

from __future__ import annotations

import base64
import html
import os

import pandas as pd

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}
table{border-collapse:collapse;font-size:13px;margin-bottom:1.5em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3} td:first-child,th:first-child{text-align:left}
img{max-width:100%;border:1px solid #ddd}
figure{margin:0 0 1.5em 0}
.row{display:flex;flex-wrap:wrap;gap:2em} .row table{margin-top:0}
.big{font-size:1.3em}
"""


def _fmt(df: pd.DataFrame) -> str:
    """A table with errors as signed percentages, shares as percentages and times in ms."""
    df = df.copy()
    for c in df.columns:
        if "abs_error" in c:
            df[c] = df[c].map(lambda v: "" if pd.isna(v) else f"{v * 100:.2f}%")
        elif "error" in c:
            df[c] = df[c].map(lambda v: "" if pd.isna(v) else f"{v * 100:+.2f}%")
        elif c in ("share", "cum_share"):
            df[c] = df[c].map(lambda v: "" if pd.isna(v) else f"{v * 100:.1f}%")
        elif c.endswith("_s"):
            df[c] = df[c].map(lambda v: "" if pd.isna(v) else f"{v * 1e3:.4f} ms")
    return df.to_html(index=False, border=0, escape=True)


TOP_ROWS = 8  # rows of each "top differences" table


def headline_html(c, s: dict | None = None) -> str:
    """The step time, the makespan and where their difference comes from, as an HTML fragment."""
    s = s or c.summary()
    m, t, e = s["makespan"], s["tasks"], s["task_duration_error"]
    med = "n/a" if e["median_error"] is None else f"{e['median_error'] * 100:+.2f}%"
    p90 = "n/a" if e["p90_abs_error"] is None else f"{e['p90_abs_error'] * 100:.2f}%"
    parts = [
        _step(s["step"], m),
        "<p>Of the makespan difference ({:+.4f} ms), task durations account for {:+.4f} ms and idle time "
        "(waiting on dependencies, scheduling) for {:+.4f} ms, averaged over {} workers.</p>".format(
            m["diff_s"] * 1e3, m["from_task_time_s"] * 1e3, m["from_idle_time_s"] * 1e3, m["workers"]),
        f"<p>Tasks matched: {t['matched']} (only predicted: {t['pred_only']}, only measured: {t['real_only']}). "
        f"Task duration error: median {med}, 90th percentile of |error| {p90}. "
        "Errors are (predicted - measured) / measured.</p>",
        _transfers(s["transfers"]),
    ]
    if s.get("disk"):
        from tilecast.reports.disk_traffic import disk_html
        parts.append(disk_html(s["disk"]))
    return "\n".join(parts)


def top_differences_html(c) -> str:
    """The phases and the single tasks that account for most of the difference, side by side."""
    tasks = c.pairs.iloc[c.pairs["diff_s"].abs().to_numpy().argsort(kind="stable")[::-1][:TOP_ROWS]]
    tasks = tasks[["task", "kernel", "tag", "pred_s", "real_s", "diff_s", "error"]]
    return ("<h2>Top differences</h2><div class=row>"
            f"<div><h3>Phases (tags with layer numbers merged)</h3>{_fmt(c.by_phase.head(TOP_ROWS))}</div>"
            f"<div><h3>Single tasks</h3>{_fmt(tasks)}</div></div>")


def details_html(c, s: dict | None = None) -> str:
    """The tables per kernel, before/after, tag and worker, as an HTML fragment."""
    s = s or c.summary()
    parts = [
        "<h2>Where the prediction went wrong: kernels</h2>", _fmt(c.by_kernel),
        _before_after(c, s),
        "<h2>Tags</h2>", _fmt(c.by_tag.head(20)),
        "<h2>Workers: busy and idle time</h2>", _fmt(c.by_worker),
    ]
    return "\n".join(parts)


def tables_html(c) -> str:
    """The comparison's figures and tables as an HTML fragment (the notebook view)."""
    s = c.summary()
    return "\n".join([headline_html(c, s), top_differences_html(c), details_html(c, s)])


def _ms(v) -> str:
    return "unknown" if v is None else f"{v * 1e3:.3f} ms"


def _pct(v) -> str:
    return "" if v is None else f"{v * 100:+.2f}%"


def _step(st: dict, m: dict) -> str:
    """The step time first, with the makespan and the host time as its parts; the makespan of the traced
    step after it. When a step time is unknown, the makespan is the headline."""
    traced = ("<p{}>Makespan of the traced step: predicted {:.4f} ms, measured {:.4f} ms, error <b>{:+.2f}%</b>"
              "</p>").format
    if st["error"] is None:
        missing = " and ".join(w for w, k in (("predicted", "pred_s"), ("measured", "real_s")) if st[k] is None)
        known = "".join(f", {w} {_ms(st[k])}" for w, k in (("predicted", "pred_s"), ("measured", "real_s"))
                        if st[k] is not None)
        return (f"<p>Step time: {missing} not recorded with the traces{known}; only the makespan, the part of "
                f"the step its tasks take, is compared.</p>"
                + traced(" class=big", m["pred_s"] * 1e3, m["real_s"] * 1e3, m["error"] * 100))
    rows = "".join(
        f"<tr><td>{name}</td><td>{_ms(st[f'pred{k}'])}</td><td>{_ms(st[f'real{k}'])}</td><td>{_pct(err)}</td></tr>"
        for name, k, err in (("<b>step time</b>", "_s", st["error"]),
                             ("makespan (the tasks)", "_makespan_s", st["makespan_error"]),
                             ("host (the step outside its tasks)", "_host_s", None)))
    return ("<p class=big>Step time: predicted {:.3f} ms, measured {:.3f} ms, error <b>{:+.2f}%</b></p>".format(
                st["pred_s"] * 1e3, st["real_s"] * 1e3, st["error"] * 100)
            + f"<table><tr><th></th><th>predicted</th><th>measured</th><th>error</th></tr>{rows}</table>"
            + traced("", m["pred_s"] * 1e3, m["real_s"] * 1e3, m["error"] * 100))


def _before_after(c, s: dict) -> str:
    if c.before is None:
        return ""
    from tilecast.reports.before_after import before_after_kernels

    b = s["before_after"]
    return ("<h2>Before and after recalibration</h2>"
            + (f"<p>Step time error {b['step_error_before'] * 100:+.2f}% before, "
               f"{b['step_error_after'] * 100:+.2f}% after. " if b["step_error_after"] is not None else "<p>")
            + f"Makespan error {b['makespan_error_before'] * 100:+.2f}% before, "
            f"{b['makespan_error_after'] * 100:+.2f}% after.</p>" + _fmt(before_after_kernels(c.before, c)))


def _transfers(t: dict) -> str:
    if not (t["pred_count"] or t["real_count"]):
        return ""
    return (f"<p>Transfers: predicted {t['pred_count']} ({t['pred_bytes'] / 1e6:.2f} MB, {t['pred_s'] * 1e3:.3f} ms "
            f"of link time), measured {t['real_count']} ({t['real_bytes'] / 1e6:.2f} MB, "
            f"{t['real_s'] * 1e3:.3f} ms).</p>")


def _img(path: str, alt: str) -> str:
    with open(path, "rb") as f:
        data = base64.b64encode(f.read()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def write_html(c, paths: dict, out: str) -> str:
    """Write the report page; ``paths`` holds the PNGs and the Chrome JSON files written beside it.

    The page stands alone: styles inline, the charts embedded as PNG data, no script and nothing fetched
    from a network, so it opens offline in any browser (``tests/test_report_browser.py`` renders it in
    headless Chromium). Charts come first after the headline figures, then the top differences, then
    the full tables."""
    here = os.path.dirname(os.path.abspath(out))
    link = lambda key: html.escape(os.path.relpath(paths[key], here))  # noqa: E731
    chrome = ""
    if "pred_chrome_json" in paths:
        chrome = (f'Chrome traces, to open in Perfetto (ui.perfetto.dev, online) or chrome://tracing: '
                  f'<a href="{link("pred_chrome_json")}">predicted</a>, '
                  f'<a href="{link("real_chrome_json")}">measured</a>; ')
    s = c.summary()
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tilecast: prediction vs measurement</title>
<style>{_STYLE}</style></head><body>
<h1>Prediction vs measurement</h1>
{headline_html(c, s)}
<h2>Schedules (predicted above, measured below)</h2>
<figure id="gantt">{_img(paths["gantt_png"], "Gantt chart")}</figure>
<h2>Error by kernel</h2>
<figure id="kernel-errors">{_img(paths["errors_png"], "error by kernel")}</figure>
{top_differences_html(c)}
{details_html(c, s)}
<p>{chrome}<a href="{link("summary_json")}">summary JSON</a>, <a href="{link("by_kernel_csv")}">errors per kernel
(CSV)</a>.</p>
</body></html>
"""
    with open(out, "w", encoding="utf-8") as f:
        f.write(page)
    return out
