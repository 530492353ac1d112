"""The disk traffic of a memory-limited step, predicted beside measured.

Each trace may record its step's disk counters (:func:`tilecast.trace.disk_counters`):
the simulator's forecast counts transfers and evictions; a run measures the
transfers on the bus between main memory and the disk node (StarPU 1.3.10's
bus profiling counts transfers and bytes, not evictions, so measured
evictions are unknown).
"""

from __future__ import annotations

from tilecast import trace as tr
from tilecast.reports.makespan import relative_error

#: (counter, label, unit) of the rows, in order
ROWS = (
    ("writes", "transfers to disk (write-backs + tidied)", "tiles"),
    ("written_bytes", "bytes written to disk", "bytes"),
    ("reads", "transfers from disk", "tiles"),
    ("read_bytes", "bytes read from disk", "bytes"),
    ("evictions", "evictions from main memory", "tiles"),
    ("writebacks", "  of them written back", "tiles"),
    ("dropped", "  of them dropped (clean)", "tiles"),
    ("tidied", "tidied (written back ahead of need)", "tiles"),
)


def disk_summary(pred, real) -> dict | None:
    """``{"rows": [...]}`` with one row per counter either trace records (``counter``, ``label``, ``unit``,
    ``pred``, ``real``: None where that trace does not record it, ``error``: (pred - real) / real when both
    are known and real is not 0); None when neither trace records disk counters."""
    p, r = tr.disk_counters(pred), tr.disk_counters(real)
    if p is None and r is None:
        return None
    p, r = p or {}, r or {}
    rows = []
    for key, label, unit in ROWS:
        if key not in p and key not in r:
            continue
        a, b = p.get(key), r.get(key)
        err = relative_error(a, b) if a is not None and b else None
        rows.append({"counter": key, "label": label, "unit": unit, "pred": a, "real": b, "error": err})
    return {"rows": rows}


def format_count(value, unit: str) -> str:
    """A counter for a table: bytes in MiB/GiB (binary), tiles as a number, '-' when unknown."""
    if value is None:
        return "-"
    if unit == "bytes":
        for name, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if abs(value) >= scale:
                return f"{value / scale:.2f} {name}"
        return f"{int(value)} B"
    return f"{int(value):,}"


def disk_lines(summary: dict) -> list[str]:
    """The disk table of ``tilecast compare``: one line per counter."""
    out = [f"{'disk traffic per step':<44}{'predicted':>14}{'measured':>14}{'error':>10}"]
    for row in summary["rows"]:
        err = "" if row["error"] is None else f"{row['error'] * 100:+.1f}%"
        out.append(f"{row['label']:<44}{format_count(row['pred'], row['unit']):>14}"
                   f"{format_count(row['real'], row['unit']):>14}{err:>10}")
    if any(row["real"] is None for row in summary["rows"]):
        out.append("  measured '-': not recorded (StarPU 1.3.10 counts transfers and bytes per bus, not evictions)")
    return out


def disk_html(summary: dict) -> str:
    """The disk section of the HTML report."""
    from html import escape

    cells = []
    for row in summary["rows"]:
        err = "" if row["error"] is None else f"{row['error'] * 100:+.1f}%"
        cells.append(f"<tr><td>{escape(row['label'].strip())}</td><td>{format_count(row['pred'], row['unit'])}</td>"
                     f"<td>{format_count(row['real'], row['unit'])}</td><td>{err}</td></tr>")
    return ("<h2>Disk traffic per step</h2>\n<p>Transfers between main memory and the disk node, and evictions "
            "from main memory; '-' where a trace does not record it (StarPU counts transfers and bytes per bus, "
            "not evictions).</p>\n<table><tr><th>counter</th><th>predicted</th><th>measured</th><th>error</th></tr>\n"
            + "\n".join(cells) + "\n</table>\n")
