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


def tables_html(c) -> str:
    """The comparison's figures and tables as an HTML fragment."""
    s = c.summary()
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
        "<h2>Where the prediction went wrong: kernels</h2>", _fmt(c.by_kernel),
        _before_after(c, s),
        "<h2>Phases (tags with layer numbers merged)</h2>", _fmt(c.by_phase.head(20)),
        "<h2>Tags</h2>", _fmt(c.by_tag.head(20)),
        "<h2>Workers: busy and idle time</h2>", _fmt(c.by_worker),
    ]
    return "\n".join(parts)


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
    """Write the report page; ``paths`` holds the PNGs and the Chrome JSON files written beside it."""
    here = os.path.dirname(os.path.abspath(out))
    link = lambda key: html.escape(os.path.relpath(paths[key], here))  # noqa: E731
    chrome = ""
    if "pred_chrome_json" in paths:
        chrome = (f'Chrome traces (open in <a href="https://ui.perfetto.dev">Perfetto</a>): '
                  f'<a href="{link("pred_chrome_json")}">predicted</a>, '
                  f'<a href="{link("real_chrome_json")}">measured</a>; ')
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>tilecast: prediction vs measurement</title>
<style>{_STYLE}</style></head><body>
<h1>Prediction vs measurement</h1>
{tables_html(c)}
<h2>Schedules (predicted above, measured below)</h2>
{_img(paths["gantt_png"], "Gantt chart")}
<h2>Error by kernel</h2>
{_img(paths["errors_png"], "error by kernel")}
<p>{chrome}<a href="{link("summary_json")}">summary JSON</a>.</p>
</body></html>
"""
    with open(out, "w", encoding="utf-8") as f:
        f.write(page)
    return out
