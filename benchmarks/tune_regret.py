"""Tune's regret on first use: how much slower, measured, is the configuration ``tune`` picks than the best one.

From an empty ``$TILECAST_HOME`` (a fresh temporary one; ``tune`` calibrates
the machine first, nothing of these shapes has run), ``tune`` ranks its
default candidates (every tiling of :mod:`tilecast.loop.candidates`, its
default schedulers, 1 and 2 workers) for each of three model shapes that
no suite or probe uses. Then a stated sample of the ranking runs on StarPU:
the ``--top`` best predicted and ``--others`` spread over the rest of the
ranking down to its last (``tilecast tune --execute TOP --others OTHERS``).
The regret of a shape is the measured step of tune's first choice over the
fastest measured step of the sample, less 1 (target: at most 5%).

Prints a table per shape (predicted and measured, tune's rank), then one
JSON line with ``regret`` per shape, ``max_regret``, ``sample`` and the
conditions (CPU, the kernels' BLAS and its core).

    python3 benchmarks/tune_regret.py [--top 4] [--others 8] [--steps 5] [--warmup 2] [--shapes 2x128,3x96]
    python3 benchmarks/tune_regret.py --home DIR ...   (a calibrated home: checks the script, not a first use)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

SHAPES = [
    ("2x128", dict(n_layer=2, n_embd=128, n_head=4, vocab_size=1024, n_positions=256), 4, 128),
    ("3x96", dict(n_layer=3, n_embd=96, n_head=3, vocab_size=500, n_positions=256), 6, 96),
    ("2x384", dict(n_layer=2, n_embd=384, n_head=6, vocab_size=4000, n_positions=512), 4, 128),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=4, help="best predicted configurations run per shape")
    ap.add_argument("--others", type=int, default=8, help="configurations run from the rest of the ranking")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--shapes", default=",".join(s[0] for s in SHAPES), help="which shapes (comma-separated)")
    ap.add_argument("--home", metavar="DIR",
                    help="use this $TILECAST_HOME (its calibration, and whatever ran there) instead of a fresh one: "
                         "not a first-use figure; for checking the script without calibrating")
    args = ap.parse_args()
    unknown = set(args.shapes.split(",")) - {s[0] for s in SHAPES}
    if unknown:
        ap.error(f"--shapes: unknown shape {sorted(unknown)[0]!r} (known: {', '.join(s[0] for s in SHAPES)})")
    if args.home and not os.path.isdir(args.home):
        ap.error(f"--home: {args.home} is not a directory")
    # nothing has run in a fresh home: tune calibrates the machine first
    os.environ["TILECAST_HOME"] = args.home or tempfile.mkdtemp(prefix="tilecast-regret-")
    import tilecast as tc
    from tilecast.graph import Tiling
    from tilecast.loop.candidates import short_label
    from tilecast.perfmodel.local import conditions_line, run_conditions

    conditions = run_conditions()
    print(conditions_line(conditions))

    wanted = args.shapes.split(",")
    out = {}
    t0 = time.perf_counter()
    for name, spec, batch, seq in [s for s in SHAPES if s[0] in wanted]:
        res = tc.tune({**spec, "name": name}, batch=batch, seq=seq, execute=args.top, others=args.others,
                      steps=args.steps, warmup=args.warmup, progress=True)
        rows = sorted(res.executed, key=lambda r: r["rank"])
        best = min(r["real_step_s"] for r in rows)
        choice = rows[0]
        regret = choice["real_step_s"] / best - 1.0
        print(f"\n{name}: batch {batch} x {seq}, {res.configurations} candidates ranked, {len(rows)} run")
        print(f"{'rank':>5} {'tiling':<34}{'sched':>7}{'w':>3}{'predicted ms':>14}{'measured ms':>13}{'error':>8}")
        for r in rows:
            mark = " <- fastest measured" if r["real_step_s"] == best else ""
            print(f"{r['rank']:>5} {short_label(Tiling.parse(r['tiling']))[:33]:<34}{r['sched']:>7}{r['workers']:>3}"
                  f"{r['pred_step_s'] * 1e3:>14.1f}{r['real_step_s'] * 1e3:>13.1f}{100 * r['error']:>7.1f}%{mark}")
        print(f"regret of tune's choice: {100 * regret:.1f}%")
        out[name] = {"regret": regret, "choice": {k: choice[k] for k in ("tiling", "sched", "workers")},
                     "candidates": res.configurations, "run": len(rows),
                     "rows": [{k: r[k] for k in ("rank", "tiling", "sched", "workers", "pred_step_s", "real_step_s",
                                                 "error")} for r in rows]}
    summary = {"regret": {k: v["regret"] for k, v in out.items()}, "first_use": not args.home,
               "max_regret": max(v["regret"] for v in out.values()),
               "sample": f"tune's {args.top} best and {args.others} spread over the rest of its ranking, per shape",
               "wall_s": time.perf_counter() - t0, "shapes": out, "conditions": conditions}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
