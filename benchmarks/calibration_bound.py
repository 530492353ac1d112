"""What first-use calibration would time for a cluster-size model, with and without the bound on a shape.

Builds ``tilecast tune``'s candidate graphs of a model at a tiny batch (default llama3-70b, 1 x 128), takes
their distinct kernel shapes as an empty store lacks them, and prints, for the design of
:mod:`tilecast.perfmodel.calibration_design` under the default budget, without the bound (what was timed
before) and with it: the shapes timed, the estimated seconds of timing (StarPU tasks on 2 workers), the
longest task and the largest buffers (on 2 lanes) among them, and how many of them are over the bound.
Nothing is timed: the estimates are this machine's roofline (``tilecast.perfmodel.local``). Ends with one
JSON line of the figures.

    python3 benchmarks/calibration_bound.py [--model llama3-70b] [--batch 1] [--seq 128]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from tilecast.graph.model_config import load_model
from tilecast.loop.kernel_calibration import (BUDGET_S, HOT_PASSES, STARPU_PASSES, bounded_cases, buffer_bytes,
                                              estimated_seconds, missing_cases, starpu_repeats, timing_cost_s)
from tilecast.loop.tune import build_candidates
from tilecast.perfmodel import load_machine
from tilecast.perfmodel.calibration_design import choose_timed

LANES = 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-70b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args()
    start = time.monotonic()
    machine = load_machine("local")
    graphs, skipped = build_candidates(load_model(args.model), args.batch, args.seq)
    cases = missing_cases(None, [g for _, g in graphs])
    del graphs
    est = estimated_seconds(machine, cases)
    cost = timing_cost_s(cases, est, starpu_repeats(est), LANES, STARPU_PASSES + HOT_PASSES)
    over, bound = bounded_cases(machine, None, cases, LANES)
    nbytes = buffer_bytes(cases, LANES)
    out = {"model": args.model, "batch": args.batch, "seq": args.seq, "shapes": len(cases),
           "all_estimated_s": float(cost.sum()), "over_bound": int(over.sum()), "bound": bound,
           "budget_s": BUDGET_S, "load_average": os.getloadavg()[0]}
    print(f"{args.model} {args.batch} x {args.seq}: {len(cases)} distinct shapes, timing all estimated at "
          f"{cost.sum():.0f} s; {int(over.sum())} over the bound (task > {bound['max_task_s']} s or buffers > "
          f"{bound['max_bytes'] / 2**30:.1f} GiB on {LANES} lanes)")
    for label, flags in (("without the bound", None), ("with the bound", over)):
        timed, _ = choose_timed(cases, cost, BUDGET_S, over=flags)
        t = np.asarray(timed)
        row = {"timed": len(t), "estimated_s": float(cost[t].sum()), "longest_task_s": float(est[t].max()),
               "largest_buffers_GiB": float(nbytes[t].max() / 2**30), "timed_over_bound": int(over[t].sum()),
               "over_bound_estimated_s": float(cost[t][over[t]].sum())}
        out[label.replace(" ", "_")] = row
        print(f"  {label:<18} {row['timed']:>5} timed, {row['estimated_s']:>6.0f} s estimated, longest task "
              f"{row['longest_task_s']:.2f} s, largest buffers {row['largest_buffers_GiB']:.1f} GiB, "
              f"{row['timed_over_bound']} over the bound ({row['over_bound_estimated_s']:.0f} s)")
    out["wall_s"] = time.monotonic() - start
    print(json.dumps(out))


if __name__ == "__main__":
    main()
