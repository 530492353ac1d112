"""The cost between tasks fitted to the mean delay, and learned from runs: old and new models on the same runs.

Loads measurements saved by ``benchmarks/learning_repeat.py --save`` or
``benchmarks/gap_decomposition.py --save`` (accuracy-suite configurations,
traced steps), runs the scheduler probes of ``tilecast calibrate`` once
(traced, ``--repeats`` steps each, for every worker count and policy of the
configurations) and predicts each configuration four ways from the same
probe traces and the same measured runs:

- first use, old: the cost between tasks fitted on the probes as before
  (``fit_gap_model(mean=False)``: the typical delay, the longest 2% trimmed);
- first use, new: the same fit with its constant moved so that it gives the
  probes' mean delay (:func:`tilecast.loop.runtime_overhead.mean_excess`);
- repeatability, old: learned from the configurations' own runs as
  ``tilecast accuracy`` did (durations, host cost), on the old probe fit;
- repeatability, new: also learning what the runs wait between tasks beyond
  their simulation (:func:`tilecast.loop.execute.learn_delay_excess`), on the
  new probe fit.

Needs StarPU and a calibration in ``$TILECAST_HOME``. Prints a table, the
median |error| and median signed error per view and worker count, then one
JSON line.

    python3 benchmarks/delay_excess.py --load runs.pkl [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gap_decomposition import with_gap_fits  # noqa: E402

VIEWS = ("first_old", "first_new", "repeat_old", "repeat_new")


def probe_fits(configs, repeats: int) -> dict:
    """{(workers, sched): {"old": coefficients, "new": coefficients}} fitted on one set of traced probe steps."""
    from tilecast.loop.host_cost import SCHED_PROBES, measure_probes
    from tilecast.loop.runtime_overhead import fit_gap_model

    out = {}
    for w, sched in sorted({(c.workers, c.sched) for c in configs}):
        print(f"probe steps: {sched} on {w} worker(s)", file=sys.stderr)
        traced = measure_probes(w, SCHED_PROBES, repeats, sched)[2]
        out[(w, sched)] = {"old": fit_gap_model(traced, mean=False).tolist(), "new": fit_gap_model(traced).tolist()}
    return out


def evaluate(configs, measurements, fits) -> list:
    from tilecast.loop.execute import learn_from_measurements
    from tilecast.loop.host_cost import calibrated_only, load_host_costs
    from tilecast.loop.predict import predict
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.calibration import find_calibration

    machine = load_machine("local")
    cal_all, host_all = find_calibration(machine), load_host_costs(machine)
    if cal_all is None or not host_all:
        sys.exit("no calibration here: run `tilecast calibrate` first (same $TILECAST_HOME)")
    cal0 = cal_all.calibrated_only()
    host = {v: with_gap_fits(calibrated_only(host_all), fits, v) for v in ("old", "new")}
    models = {"first_old": (cal0, host["old"]), "first_new": (cal0, host["new"]),
              "repeat_old": learn_from_measurements(configs, measurements, machine, cal0, host["old"], excess=False),
              "repeat_new": learn_from_measurements(configs, measurements, machine, cal0, host["new"])}
    rows = []
    for c, m in zip(configs, measurements):
        row = {"config": c.label(), "workers": c.workers, "sched": c.sched, "tasks": int(m.graph.n_tasks),
               "real_ms": 1e3 * m.median_s}
        for v, (cal, h) in models.items():
            p = predict(c, machine, cal, h, graph=m.graph)
            row[v] = (p.step_s - m.median_s) / m.median_s
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--load", required=True, help="measurements pickled by learning_repeat.py or "
                                                  "gap_decomposition.py --save")
    ap.add_argument("--repeats", type=int, default=5, help="traced steps per probe (default 5)")
    args = ap.parse_args(argv)
    if not os.path.exists(args.load):
        print(f"--load: no such file {args.load}", file=sys.stderr)
        return 2
    with open(args.load, "rb") as f:
        saved = pickle.load(f)
    configs, measurements, measured = saved[:3]
    load_before = os.getloadavg()[0]
    fits = probe_fits(configs, args.repeats)
    rows = evaluate(configs, measurements, fits)
    from tilecast.perfmodel.local import conditions_line, run_conditions

    conditions = run_conditions()
    print(conditions_line(conditions), f"; runs measured at load average {measured['load_average_before']:.2f}"
          f"-{measured['load_average_after']:.2f}; probes at {load_before:.2f}-{os.getloadavg()[0]:.2f}")
    print(f"{'configuration':<62}{'real ms':>9}" + "".join(f"{v:>12}" for v in VIEWS))
    for r in rows:
        print(f"{r['config'][:61]:<62}{r['real_ms']:>9.1f}" + "".join(f"{100 * r[v]:>+11.1f}%" for v in VIEWS))
    for w in sorted({r["workers"] for r in rows}):
        sel = [r for r in rows if r["workers"] == w]
        print(f"{w} worker(s), median |error| / signed:" + "".join(
            f"  {v} {100 * np.median([abs(r[v]) for r in sel]):.1f}% / {100 * np.median([r[v] for r in sel]):+.1f}%"
            for v in VIEWS))
    fits_us = {f"{w}:{s}": {k: [round(1e6 * x, 3) for x in c] for k, c in f.items()} for (w, s), f in fits.items()}
    print(json.dumps({"rows": rows, "probe_fits_us": fits_us, "conditions": {**measured, **conditions}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
