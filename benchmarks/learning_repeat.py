"""Learning from traces: first use, held out and repeatability on a few hand-picked configurations, with the parts.

Measures a few accuracy-suite configurations on StarPU (each in ``--rounds``
sessions of a warm-up and ``--steps`` timed steps, the last timed steps of
each session traced), then predicts each three ways as ``tilecast accuracy``
does: from the calibration alone (first use), after learning from the runs
of the other model shapes (held out), after learning from all of them, its
own included (repeatability). Beside each prediction, its parts against the
measured ones: the sum of the task durations (simulated, and in the traced
steps: the median over the traces), the time between a worker's tasks and
idle (makespan x workers less the durations), the host cost.

The measurements can be saved (``--save FILE``, a pickle of the configurations
and measurements) and evaluated again later or with other code (``--load
FILE``), so that before and after a change to the learning path are compared
on the very same runs. Needs ``tilecast calibrate`` (kernel shapes and probes
for the configurations' policies and worker counts) in ``$TILECAST_HOME``.
Prints a table, then one JSON line: ``rows`` (per configuration and view:
``step_ms`` predicted and ``real_step_ms``, ``error``, ``work_ms`` the sum of
task durations predicted and ``real_work_ms`` traced, ``between_ms`` the
makespan x workers less the work, predicted and ``real_between_ms``,
``gaps_ms`` the sum of the tasks' start delays beyond their worker being
free and their inputs written, predicted and ``real_gaps_ms`` (without the
2% longest: a worker preempted by other work), ``host_ms`` and
``real_host_ms``) and ``conditions`` (load average before
and after, cores, CPU).

    python3 benchmarks/learning_repeat.py [--configs gpt2-4x128:embd=32,inner=32,vocab=32:dmda,...]
        [--workers 1,2] [--steps 6] [--rounds 2] [--save runs.pkl | --load runs.pkl]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys

import numpy as np

DEFAULT = ("gpt2-4x128:embd=32,inner=32,vocab=32:dmda", "gpt2-5h:48:eager", "llama-3x192:64:dmda")
VIEWS = ("first_use", "held_out", "repeatability")


def configs_of(specs, workers) -> list:
    """StepConfigs of ``model:tiling:sched`` specs (model: an accuracy-suite shape's name), every worker count."""
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import from_dict
    from tilecast.loop.accuracy_suite import LLAMA, LONG, MANY_SMALL, UNEVEN
    from tilecast.loop.config import StepConfig

    shapes = {s.model["name"]: s for s in (UNEVEN, MANY_SMALL, LONG, LLAMA)}
    out = []
    for spec in specs:
        name, tile, sched = spec.split(":")
        s = shapes[name]
        for w in workers:
            out.append(StepConfig(from_dict(s.model, name=name), s.batch, s.seq, Tiling.parse(tile), sched, w))
    return out


def measure_all(configs, steps: int, rounds: int, warmup: int) -> list:
    from tilecast.loop.measure import measure

    out = []
    for c in configs:
        print(f"measuring {c.label()}", file=sys.stderr)
        m = measure(c, steps=steps, warmup=warmup, rounds=rounds)
        out.append(m)
    return out


def _gaps(graph, trace, trim: float = 0.0) -> float:
    """Sum of the start delays of a trace's tasks (s), without the ``trim`` share of the longest."""
    from tilecast.loop.runtime_overhead import start_delays

    d = np.sort(start_delays(graph, trace))
    return float(d[:max(1, int(len(d) * (1.0 - trim)))].sum()) if len(d) else 0.0


def parts(pred, measurement) -> dict:
    """A prediction's parts and the measured ones (ms)."""
    res = pred.result
    g = measurement.graph
    work = float((res.end - res.start).sum())
    w = pred.config.workers
    traced = [t[(t["task"] >= 0) & (t["source"] == "real")] for t in measurement.traces]
    real_work = float(np.median([(t["end_s"] - t["start_s"]).sum() for t in traced]))
    real_mk = measurement.makespan_s
    return {"step_ms": pred.step_s * 1e3, "real_step_ms": measurement.median_s * 1e3,
            "error": (pred.step_s - measurement.median_s) / measurement.median_s,
            "work_ms": work * 1e3, "real_work_ms": real_work * 1e3,
            "between_ms": (pred.makespan_s * w - work) * 1e3, "real_between_ms": (real_mk * w - real_work) * 1e3,
            "gaps_ms": _gaps(g, res.trace()) * 1e3,
            "real_gaps_ms": float(np.median([_gaps(g, t, 0.02) for t in traced])) * 1e3,
            "host_ms": pred.host_s * 1e3, "real_host_ms": measurement.host_s * 1e3}


def evaluate(configs, measurements) -> list:
    from tilecast.loop.accuracy_suite import shape_of
    from tilecast.loop.execute import learn_from_measurements
    from tilecast.loop.host_cost import calibrated_only, load_host_costs
    from tilecast.loop.predict import predict
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.calibration import find_calibration

    machine = load_machine("local")
    cal_all, host_all = find_calibration(machine), load_host_costs(machine)
    if cal_all is None or not host_all:
        sys.exit("no calibration here: run `tilecast calibrate` first (same $TILECAST_HOME)")
    cal0, host0 = cal_all.calibrated_only(), calibrated_only(host_all)
    learned = {"repeatability": learn_from_measurements(configs, measurements, machine, cal0, host0)}
    rows = []
    for i, (c, m) in enumerate(zip(configs, measurements)):
        train = [j for j, d in enumerate(configs) if shape_of(d) != shape_of(c)]
        models = {"first_use": (cal0, host0), "repeatability": learned["repeatability"]}
        if train:
            models["held_out"] = learn_from_measurements([configs[j] for j in train],
                                                         [measurements[j] for j in train], machine, cal0, host0)
        row = {"config": c.label(), "model": c.model.name, "sched": c.sched, "workers": c.workers,
               "tasks": int(m.graph.n_tasks)}
        for v, (cal, host) in models.items():
            row[v] = parts(predict(c, machine, cal, host, graph=m.graph, keep_result=True), m)
        rows.append(row)
    return rows


def print_table(rows) -> None:
    print(f"{'configuration':<58}{'view':>14}{'step':>8}{'real':>8}{'error':>8}{'work':>8}{'real':>8}"
          f"{'between':>9}{'real':>8}{'gaps':>7}{'real':>7}{'host':>6}{'real':>6}")
    for r in rows:
        for v in VIEWS:
            if v not in r:
                continue
            p = r[v]
            print(f"{r['config'][:57]:<58}{v:>14}{p['step_ms']:>8.1f}{p['real_step_ms']:>8.1f}"
                  f"{100 * p['error']:>+7.1f}%{p['work_ms']:>8.1f}{p['real_work_ms']:>8.1f}"
                  f"{p['between_ms']:>9.1f}{p['real_between_ms']:>8.1f}{p['gaps_ms']:>7.1f}{p['real_gaps_ms']:>7.1f}"
                  f"{p['host_ms']:>6.1f}{p['real_host_ms']:>6.1f}")
    print("(ms; work: sum of task durations; between: makespan x workers less the work; gaps: start delays "
          "beyond the worker being free and the inputs written, measured without the 2% longest; host: step "
          "less makespan)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default=",".join(DEFAULT).replace(",", ";"),
                    help="model:tiling:sched, separated by ';' (model: an accuracy-suite shape)")
    ap.add_argument("--workers", default="1,2", help="worker counts (default 1,2)")
    ap.add_argument("--steps", type=int, default=6, help="timed steps per configuration (default 6)")
    ap.add_argument("--rounds", type=int, default=2, help="StarPU sessions per configuration (default 2)")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up steps per session (default 1)")
    ap.add_argument("--save", help="pickle the configurations and measurements to this file")
    ap.add_argument("--load", help="evaluate the measurements pickled in this file instead of measuring")
    args = ap.parse_args(argv)
    load_before = os.getloadavg()[0]
    if args.load:
        with open(args.load, "rb") as f:
            configs, measurements, measured = pickle.load(f)
    else:
        configs = configs_of([s for s in args.configs.split(";") if s],
                             [int(w) for w in args.workers.split(",")])
        measurements = measure_all(configs, args.steps, args.rounds, args.warmup)
        measured = {"load_average_before": load_before, "load_average_after": os.getloadavg()[0]}
        if args.save:
            with open(args.save, "wb") as f:
                pickle.dump((configs, measurements, measured), f)
    from tilecast.perfmodel.local import conditions_line, run_conditions

    conditions = run_conditions()
    print(conditions_line(conditions), f"; load average while measuring {measured['load_average_before']:.2f} "
          f"before, {measured['load_average_after']:.2f} after")
    rows = evaluate(configs, measurements)
    print_table(rows)
    print(json.dumps({"rows": rows, "conditions": {**measured, **conditions}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
