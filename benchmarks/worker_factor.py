"""The one-worker factor three ways, side by side: what calibration format 4 measured, and what format 5 does.

Takes the shapes ``tilecast calibrate`` times by default (gpt2-tiny 2 x 128 at
tiles 64, 32 and 128), or a suite shape's (``--shape``), and calibration's
one-worker sample of them (``worker_sample``), then times, in rounds, each
pass as calibration runs it (``time_in_runtime``, real StarPU):

- every shape cold on all workers (the main passes);
- the sample cold on one worker, then on all workers (the same graphs);
- the sample hot on one worker, then on all workers (format 5's
  ``worker_pair_passes``).

It prints, per kernel and over all the samples, the median of one worker's
time over all workers': cold against the main passes (format 4), cold
against the same graphs, hot against the same graphs. The last line is a
JSON object with every figure and the load average.

Usage: ``python3 benchmarks/worker_factor.py [--rounds N] [--shape NAME]``
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from tilecast.executor.runtime_timer import time_in_runtime
from tilecast.executor.starpu_session import StarPUSession
from tilecast.graph import Tiling
from tilecast.graph.model_config import from_dict, load_model
from tilecast.graph.models import build_step
from tilecast.kernels import get
from tilecast.loop.kernel_calibration import (COLD_SCHED, HOT_SCHED, estimated_seconds, starpu_repeats,
                                              worker_sample)
from tilecast.perfmodel import load_machine
from tilecast.perfmodel.calibration import cases_from_shapes
from tilecast.perfmodel.shapes import graph_shapes, shape_bytes


def shapes_of(name: str | None) -> list:
    if name is None:
        cfg = load_model("gpt2-tiny")
        return [ks for t in ("64", "32", "128") for ks in graph_shapes(build_step(cfg, 2, 128, Tiling.parse(t)))]
    from tilecast.loop.accuracy_suite import SUITES

    found = [s for s in SUITES["full"][0] if s.model["name"] == name]
    if not found:
        raise SystemExit(f"--shape: one of {', '.join(s.model['name'] for s in SUITES['full'][0])}, got {name!r}")
    s = found[0]
    cfg = from_dict(s.model, name=s.model["name"])
    return [ks for t in s.tilings for ks in graph_shapes(build_step(cfg, s.batch, s.seq, Tiling.parse(t)))]


def one_pass(workers: int, cases, repeats, sched: str) -> np.ndarray:
    with StarPUSession(sched, workers) as session:
        return time_in_runtime(cases, repeats, session)[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="rounds of the five passes (default: 2)")
    p.add_argument("--shape", default=None, help="a suite shape's tilings instead of calibrate's default shapes")
    args = p.parse_args()
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be at least 1, got {args.rounds}")
    machine = load_machine("local")
    cases = cases_from_shapes(shapes_of(args.shape))
    est = estimated_seconds(machine, cases)
    reps = np.maximum(starpu_repeats(est), 2)
    sample = worker_sample(cases, est)
    few = [cases[i] for i in sample]
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    runs: dict = {k: [] for k in ("main", "cold1", "cold2", "hot1", "hot2")}
    for _ in range(args.rounds):
        runs["main"].append(one_pass(2, cases, reps, COLD_SCHED))
        for sched, key in ((COLD_SCHED, "cold"), (HOT_SCHED, "hot")):
            runs[key + "1"].append(one_pass(1, few, reps[sample], sched))
            runs[key + "2"].append(one_pass(2, few, reps[sample], sched))
    med = {k: np.median(v, axis=0) for k, v in runs.items()}
    ratios: dict = {}
    for j, i in enumerate(sample):
        name, row = cases[i]
        k = get(name)
        nbytes = float(shape_bytes(k.id, np.asarray(row, dtype=np.float64)[None, len(k.params):])[0])
        ratios.setdefault(name, []).append([nbytes, med["cold1"][j] / med["main"][i],
                                            med["cold1"][j] / med["cold2"][j], med["hot1"][j] / med["hot2"][j]])
    print(f"{len(cases)} shapes, {len(sample)} in the one-worker sample; median of one worker's time over two "
          "workers':")
    print(f"{'kernel':<18}{'cold / main (4)':>16}{'cold / cold':>13}{'hot / hot (5)':>15}")
    per_kernel = {}
    for name, rows in ratios.items():
        a = np.asarray(rows)
        per_kernel[name] = [float(np.median(a[:, c])) for c in (1, 2, 3)]
        print(f"{name:<18}" + "".join(f"{v:>{w}.3f}" for v, w in zip(per_kernel[name], (16, 13, 15))))
    a = np.concatenate([np.asarray(r) for r in ratios.values()])
    overall = [float(np.median(a[:, c])) for c in (1, 2, 3)]
    print(f"{'all samples':<18}" + "".join(f"{v:>{w}.3f}" for v, w in zip(overall, (16, 13, 15))))
    print(json.dumps({"shape": args.shape or "tilecast calibrate's default", "shapes": len(cases),
                      "sample": len(sample), "rounds": args.rounds, "wall_s": time.monotonic() - t0,
                      "load_average_before": load_before, "load_average_after": os.getloadavg()[0],
                      "columns": ["cold_over_main_passes", "cold_over_cold_same_graphs", "hot_over_hot_same_graphs"],
                      "per_kernel": per_kernel, "all_samples": overall}))


if __name__ == "__main__":
    main()
