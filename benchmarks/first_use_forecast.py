"""First-use forecast: predictions from calibration alone, for configurations that never ran, then measured.

From an empty ``$TILECAST_HOME`` (a fresh temporary one), ``tune`` predicts every
configuration of two model shapes that tilecast's suites and probes never use
(3 layers x 96 wide, 3 heads, vocabulary 500, batch 6 x 96, tilings 48, 32, 96
and the uneven ``seq=48,embd=96,vocab=160``; 2 layers x 384, 6 heads,
vocabulary 4000, batch 4 x 128, tilings 128, 64, ``batch=2,vocab=1024``;
eager, dmda, lws, prio; 1 and 2 workers). ``--sample`` of them, drawn at
random, then run on StarPU (``--steps`` steps, the median after two warm-up
steps), and each first prediction is set against its measurement.
``--calibration alone`` times the kernels alone instead of as StarPU tasks,
for comparison.

Prints a row per configuration run, then one JSON line with
``median_abs_error``, ``max_abs_error``, ``too_fast`` (how many were predicted
faster than measured), the rows and the conditions. Targets (first use):
median <= 5%, max <= 10%.

    python3 benchmarks/first_use_forecast.py [--calibration starpu|alone] [--sample 16] [--steps 8] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

SHAPES = [
    (dict(n_layer=3, n_embd=96, n_head=3, vocab_size=500, n_positions=256), 6, 96,
     ["48", "32", "seq=48,embd=96,vocab=160", "96"]),
    (dict(n_layer=2, n_embd=384, n_head=6, vocab_size=4000, n_positions=512), 4, 128,
     ["128", "64", "batch=2,vocab=1024"]),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration", choices=["starpu", "alone"], default="starpu")
    ap.add_argument("--sample", type=int, default=16)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.environ["TILECAST_HOME"] = tempfile.mkdtemp(prefix="tilecast-first-use-")  # nothing has run here
    from tilecast.executor.starpu_run import run_steps
    from tilecast.graph import Tiling
    from tilecast.graph.gpt2 import build_gpt2_step
    from tilecast.graph.model_config import load_model
    from tilecast.loop.kernel_calibration import ensure_calibration
    from tilecast.loop.tune import tune
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.local import conditions_line, run_conditions

    conditions = run_conditions()
    print(conditions_line(conditions))
    t0 = time.perf_counter()
    machine = load_machine("local")
    rows = []
    for shape, batch, seq, tiles in SHAPES:
        cfg = load_model(json.dumps(shape))
        tilings = [Tiling.parse(t) for t in tiles]
        ensure_calibration(machine, [build_gpt2_step(cfg, batch, seq, t) for t in tilings], progress=False,
                           in_runtime=args.calibration == "starpu")
        res = tune(cfg, batch, seq, scheds=["eager", "dmda", "lws", "prio"], workers=[1, 2], tilings=tilings,
                   progress=False)
        rows += [dict(model=shape, batch=batch, seq=seq, tiling=p.config.tiling.describe(), sched=p.config.sched,
                      workers=p.config.workers, tasks=p.tasks, pred_step_s=p.step_s) for p in res.ranking]
    predict_s = time.perf_counter() - t0
    rng = np.random.default_rng(args.seed)
    chosen = [rows[i] for i in sorted(rng.choice(len(rows), size=min(args.sample, len(rows)), replace=False))]
    for r in chosen:
        cfg = load_model(json.dumps(r["model"]))
        run = run_steps(cfg, r["batch"], r["seq"], Tiling.parse(r["tiling"]), r["sched"], r["workers"],
                        args.steps + 2)
        r["real_step_s"] = float(np.median(run.step_s[2:]))
        r["error"] = (r["pred_step_s"] - r["real_step_s"]) / r["real_step_s"]
        print(f"{r['model']['n_embd']:>4} {r['batch']}x{r['seq']:<4}{r['tiling']:<48}{r['sched']:<6}{r['workers']:>2}"
              f"{r['tasks']:>7}  pred {1e3 * r['pred_step_s']:8.2f} ms  real {1e3 * r['real_step_s']:8.2f} ms"
              f"  {100 * r['error']:+6.1f}%", flush=True)
    err = np.abs([r["error"] for r in chosen])
    out = dict(calibration=args.calibration, configurations=len(rows), run=len(chosen),
               median_abs_error=float(np.median(err)), max_abs_error=float(err.max()),
               too_fast=int(sum(r["error"] < 0 for r in chosen)), calibrate_and_predict_s=predict_s,
               targets_met=bool(np.median(err) <= 0.05 and err.max() <= 0.10), rows=chosen, conditions=conditions)
    print(f"first use, kernels timed {'as StarPU tasks' if args.calibration == 'starpu' else 'alone'}: "
          f"median |error| {100 * out['median_abs_error']:.1f}%, max {100 * out['max_abs_error']:.1f}%, "
          f"{out['too_fast']} of {len(chosen)} predicted too fast (targets: median <= 5%, max <= 10%)")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
