"""The hot lanes' first shape of each graph, with and without the untimed chain that opens it, side by side.

Calibration times the hot figure of every shape under ``prio``, one graph per group of shapes, each shape's
chain of repeats back to back (:func:`tilecast.executor.runtime_timer.time_in_runtime`). On the 2-core Xeon
guest the chains that ran in a graph's first millisecond or so took 2-4x their later time, so the first shape of
each group was stored 2-4x too slow. Each graph now opens with an untimed chain of its first shape's kernel
(:func:`~tilecast.executor.runtime_timer.warmup_case`). This benchmark takes calibrate's default shapes (or a
suite shape's tilings, ``--shape``), and per round runs the hot pass with that chain and without it, and times
each group's first shape last in its group's graph (without the chain: the reference, well past the graph's
start; a graph of the shape alone is short enough to lie within that start), and prints per group's first shape
the three medians over the rounds. The last line is a JSON object with every figure,
the machine and the BLAS core.

Usage: ``python3 benchmarks/hot_lane_start.py [--rounds N] [--workers W] [--shape NAME]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from tilecast.executor import runtime_timer
from tilecast.executor.starpu_session import StarPUSession, default_workers
from tilecast.loop.kernel_calibration import HOT_SCHED, estimated_seconds, starpu_repeats
from tilecast.perfmodel import load_machine
from tilecast.perfmodel.calibration import cases_from_shapes
from tilecast.perfmodel.local import conditions_line, run_conditions

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from worker_factor import shapes_of  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds of the three timings (default: 3)")
    p.add_argument("--workers", type=int, default=None, help="workers (default: one per core, as calibrate)")
    p.add_argument("--shape", default=None, help="a suite shape's tilings instead of calibrate's default shapes")
    args = p.parse_args()
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be at least 1, got {args.rounds}")
    workers = args.workers or default_workers()
    if not 1 <= workers <= default_workers():
        raise SystemExit(f"--workers must be 1 to {default_workers()} (the cores StarPU can use), got {args.workers}")
    conditions = run_conditions()
    print(conditions_line(conditions))
    cases = cases_from_shapes(shapes_of(args.shape))
    reps = np.maximum(starpu_repeats(estimated_seconds(load_machine("local"), cases)), 2)
    ok = [i for i, c in enumerate(cases) if runtime_timer.runnable(*c)]
    groups = [[ok[j] for j in g] for g in runtime_timer._groups([cases[i] for i in ok], reps[ok], workers,
                                                                 runtime_timer.MAX_GROUP_BYTES)]
    firsts = [g[0] for g in groups]
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    runs: dict = {"with": [], "without": [], "last": []}
    with StarPUSession(HOT_SCHED, workers) as session:
        for _ in range(args.rounds):
            for key, warm in (("with", True), ("without", False)):
                runs[key].append(runtime_timer.time_in_runtime(cases, reps, session, warmup=warm)[0][firsts])
            runs["last"].append([runtime_timer.time_in_runtime([cases[i] for i in g[1:] + g[:1]], reps[g[1:] + g[:1]],
                                                               session, warmup=False)[0][-1] for g in groups])
    med = {k: np.median(np.asarray(v), axis=0) for k, v in runs.items()}
    print(f"{len(cases)} shapes in {len(firsts)} graphs, {workers} worker(s), {args.rounds} round(s); "
          "each graph's first shape, hot (median over the rounds, us):")
    print(f"{'kernel':<10}{'shape':<34}{'with chain':>12}{'without':>10}{'last':>9}")
    rows = []
    for j, i in enumerate(firsts):
        name, row = cases[i]
        shape = ",".join(f"{x:g}" for x in row[:7])
        print(f"{name:<10}{shape:<34}" + "".join(f"{med[k][j] * 1e6:>{w}.2f}"
                                                    for k, w in (("with", 12), ("without", 10), ("last", 9))))
        rows.append({"kernel": name, "shape": [float(x) for x in row], "with_chain_s": float(med["with"][j]),
                     "without_s": float(med["without"][j]), "last_s": float(med["last"][j]),
                     "rounds_with_s": [float(r[j]) for r in runs["with"]],
                     "rounds_without_s": [float(r[j]) for r in runs["without"]]})
    print(json.dumps({"shape": args.shape or "tilecast calibrate's default", "shapes": len(cases),
                      "graphs": len(firsts), "workers": workers, "rounds": args.rounds,
                      "wall_s": time.monotonic() - t0, "load_average_before": load_before,
                      "load_average_after": os.getloadavg()[0], "first_shapes": rows, "conditions": conditions}))


if __name__ == "__main__":
    main()
