"""The inference validation as Markdown: the generated blocks of ``validation/README.md``.

``python3 -m tilecast.cluster.inference_report`` prints them (every row's
error; medians per source, per cluster and overall; each Argonne and NeMo
source predicted with another engine's profile); ``--write`` replaces the
blocks between ``<!-- inference_report NAME -->`` and
``<!-- /inference_report -->`` in the README, so its figures stay what the
code gives after a refit (``inference_calibrate --write``).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import replace

import numpy as np

from tilecast.cluster.inference_validation import compare_inference, load_inference_runs, median_abs_error

README = os.path.join(os.path.dirname(__file__), "validation", "README.md")
MAX_ERROR = 0.35  # `tilecast validate --inference-max-error`'s default
TIMES = ("ttft_s", "tpot_s", "request_latency_s")  # seconds, shown in ms; the other metrics are tokens/s
GPU = {"dgx-a100": "A100", "dgx-h100": "H100", "dgx-h200": "H200"}
# sources predicted with other engines' profiles: a forecast for an engine never fitted
TRANSFER_ROWS = ("argonne-trtllm", "argonne-vllm", "nemo")
TRANSFER_ENGINES = ("trtllm-0.6", "argonne-trtllm", "argonne-vllm")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _value(v: float, metric: str) -> str:
    return f"{1e3 * v:,.1f} ms" if metric in TIMES else f"{v:,.0f}"


def _model(m) -> str:
    return m.get("name", "custom") if isinstance(m, dict) else str(m)


def rows_table(runs, df) -> str:
    """Every row: conditions, published, predicted, error."""
    out = ["| row | source (engine profile if another) | role | GPUs | model | TP | batch | in / out | "
           "weights / KV | metric | published | predicted | error |", "|" + "---|" * 13]
    for r, d in zip(runs, df.itertuples()):
        c = r.config
        src = r.source + (f" ({r.engine})" if r.engine != r.source else "")
        batch = ("continuous, unbounded rate" if c.request_rate >= 1e8 else f"continuous, {c.request_rate:g} req/s") \
            if c.request_rate else str(c.batch)
        out.append(f"| {r.id} | {src} | {r.role} | {GPU.get(r.cluster, r.cluster)} | {_model(r.model)} | {c.tp} | "
                   f"{batch} | {c.input_len} / {c.output_len} | {c.weight_dtype} / {c.kv_dtype} | {r.metric} | "
                   f"{_value(r.published, r.metric)} | {_value(d.predicted, r.metric)} | {100 * d.error:+.1f}% |")
    return "\n".join(out)


def summary(df) -> str:
    """Validation rows per source, per cluster and overall: median and largest |error|."""
    val = df[df.role == "validation"]
    out = []
    for src in dict.fromkeys(df.source):
        v = val[val.source == src]
        out.append(f"- {src}: {len(v)} validation rows, median |error| {_pct(median_abs_error(v))}, largest "
                   f"{_pct(v.error.abs().max())}, beyond {100 * MAX_ERROR:.0f}%: {int((v.error.abs() > MAX_ERROR).sum())}")
    for cl in dict.fromkeys(df.cluster):
        v = val[val.cluster == cl]
        out.append(f"- on {cl}: {len(v)} validation rows, median |error| {_pct(median_abs_error(v))}, largest "
                   f"{_pct(v.error.abs().max())}")
    out.append(f"- all: {len(val)} validation rows, median |error| {_pct(median_abs_error(val))}, largest "
               f"{_pct(val.error.abs().max())}; all {len(df)} rows (fitted ones included) {_pct(median_abs_error(df))}")
    return "\n".join(out)


def transfer_table(runs, own) -> str:
    """Each source of ``TRANSFER_ROWS`` predicted with each profile of ``TRANSFER_ENGINES`` (all its rows)."""
    out = ["| rows of | " + " | ".join(f"with `{e}`" for e in TRANSFER_ENGINES) + " |",
           "|" + "---|" * (1 + len(TRANSFER_ENGINES))]
    for src in TRANSFER_ROWS:
        mine = [r for r in runs if r.source == src]
        cells = []
        for eng in TRANSFER_ENGINES:
            df = own[own.source == src] if eng == src else \
                compare_inference([replace(r, engine_profile=eng) for r in mine])
            e = np.abs(df.error)
            cells.append(("(own) " if eng == src else "") + f"{_pct(np.median(e))} / {_pct(e.max())}")
        out.append(f"| `{src}` | " + " | ".join(cells) + " |")
    return "\n".join(out)


def blocks() -> dict:
    runs = load_inference_runs()
    df = compare_inference(runs)
    return {"rows": rows_table(runs, df), "summary": summary(df), "transfer": transfer_table(runs, df)}


def write(text: str, generated: dict) -> str:
    """``text`` with each marked block replaced; a block named in ``generated`` but missing is an error."""
    for name, body in generated.items():
        pat = re.compile(rf"(<!-- inference_report {name} -->\n).*?(\n<!-- /inference_report -->)", re.S)
        if not pat.search(text):
            raise ValueError(f"{README}: no block <!-- inference_report {name} -->")
        text = pat.sub(lambda m: m.group(1) + body + m.group(2), text)
    return text


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    generated = blocks()
    if "--write" in argv:
        with open(README) as f:
            text = f.read()
        with open(README, "w") as f:
            f.write(write(text, generated))
    else:
        for name, body in generated.items():
            print(f"<!-- inference_report {name} -->\n{body}\n<!-- /inference_report -->\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
