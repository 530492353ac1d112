"""The runtime's cost between tasks: measured on real traced StarPU steps, simulated before and after its model.

For each configuration (accuracy-suite shapes and tilings, none of them a
calibration probe), scheduler and worker count, a few training steps run on
StarPU as ``tilecast run`` times them (a warm-up, ``--steps`` timed, one
traced). Then:

- **gaps**: the sum over the traced step of each task's start delay (what
  passes between its worker being free, its inputs being written and its
  start; :func:`tilecast.loop.runtime_overhead.start_delays`), measured, and
  in a simulation of the same step run with the traced durations, so that
  only what the simulation charges between tasks differs: *before*, one
  constant per task (the probes' mean start delay, what the simulator charged
  until the cost between tasks was modelled); *after*, the constant plus the
  costs per buffer and per successor (:mod:`tilecast.simulator.gap_cost`),
  both as ``tilecast calibrate`` stored them;
- **step**: the step time forecast from the calibration alone (kernel models,
  no run of the configuration), before and after, against the median
  measured step.

Also prints the model fitted on each (scheduler, worker count)'s traced steps
alone, to compare with the calibration's. Needs ``tilecast calibrate`` run
first in the same ``$TILECAST_HOME``. Prints a table, then one JSON line:
``rows`` (per configuration: ``gaps_real_ms``, ``gaps_before_ms``,
``gaps_after_ms``, ``makespan_real_ms``, ``makespan_before_ms``,
``makespan_after_ms`` with the traced durations; ``step_real_ms``,
``step_before_ms``, ``step_after_ms`` forecast; ``gaps_real_trim_ms`` the
measured sum without its 2% longest gaps; ``median_us_by_successors_*``, the
median gap in microseconds after a task of 0, 1-8, 9-63, 64+ successors),
``fits`` (per scheduler and
worker count, seconds per term of ``GAP_TERMS`` fitted on these traces),
``load_average`` (before, after) and ``conditions``.

    python3 benchmarks/gap_cost.py [--steps 5] [--scheds eager,dmda] [--workers 1,2] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

import numpy as np

CONFIGS = [  # (accuracy-suite shape, tiling)
    ("MANY_SMALL", "32"),
    ("UNEVEN", "48"),
    ("LLAMA", "96"),
]


SUCCESSOR_BINS = ((0, 0), (1, 8), (9, 63), (64, 10**9))  # successors of the worker's previous task


def _medians_by_successors(graph, trace) -> list:
    """Median start delay (us) of the tasks whose worker's previous task had each bin's count of successors
    (None: no such task): robust to the long delays of a worker preempted by another process."""
    from tilecast.loop.runtime_overhead import gap_terms

    d, x = gap_terms(graph, trace)
    out = []
    for lo, hi in SUCCESSOR_BINS:
        sel = (x[:, 3] >= lo) & (x[:, 3] <= hi)
        out.append(round(1e6 * float(np.median(d[sel])), 2) if sel.any() else None)
    return out


def _trimmed_sum(d, trim=0.02) -> float:
    d = np.sort(d)
    return float(d[:max(1, int(len(d) * (1 - trim)))].sum())


def _before(h):
    """The host fit as the simulator used it before the cost between tasks was modelled: the probes' mean start
    delay (weighted by their task rate) charged before every task."""
    o = np.asarray(h.overheads, dtype=np.float64).reshape(-1, 2)
    mean = float(np.average(o[:, 1], weights=o[:, 0]))
    return replace(h, task_overhead_s=mean, gap_start_buffer_s=0.0, gap_end_buffer_s=0.0, gap_successor_s=0.0,
                   gap_ready_s=0.0, gap_handoff_s=0.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--scheds", default="eager,dmda")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--quick", action="store_true", help="the first configuration only")
    args = ap.parse_args()
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model
    from tilecast.loop import accuracy_suite
    from tilecast.loop.config import StepConfig
    from tilecast.loop.host_cost import calibrated_only, fit_key, host_cost_for, load_host_costs, measure_walls
    from tilecast.loop.predict import predict
    from tilecast.loop.runtime_overhead import GAP_TERMS, fit_gap_model, start_delays
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.calibration import find_calibration
    from tilecast.perfmodel.local import conditions_line, run_conditions
    from tilecast.reference.step import restore_built_step

    conditions = run_conditions()
    load0 = os.getloadavg()
    print(conditions_line(conditions), f"; load average {load0[0]:.2f}")
    machine = load_machine("local")
    cal = find_calibration(machine)
    fits = calibrated_only(load_host_costs(machine))
    if cal is None or not fits:
        print("gap_cost: run `tilecast calibrate` first (no stored calibration or probe fits)", file=sys.stderr)
        return 2
    scheds = args.scheds.split(",")
    workers = [int(w) for w in args.workers.split(",")]
    rows, traced = [], {}
    for shape_name, tile in CONFIGS[:1] if args.quick else CONFIGS:
        shape = getattr(accuracy_suite, shape_name)
        spec = json.dumps(shape.model)
        for sched in scheds:
            for w in workers:
                host = host_cost_for(fits, w, sched)
                if host is None or host.task_overhead_s is None:
                    print(f"gap_cost: no probe fit for {w} workers, {sched}: skipped", file=sys.stderr)
                    continue
                (graph, makespan, host_s, trace, _), = measure_walls(w, ((spec, shape.batch, shape.seq, tile),),
                                                                    args.steps, sched)
                restore_built_step(graph)
                traced.setdefault((sched, w), []).append((graph, trace))
                tasks = trace[trace["task"] >= 0].sort_values("task")
                real_d = np.zeros((1, graph.n_tasks))
                real_d[0, tasks["task"].to_numpy()] = (tasks["end_s"] - tasks["start_s"]).to_numpy()
                cfg = StepConfig(load_model(spec), shape.batch, shape.seq, Tiling.parse(tile), sched, w)
                key = fit_key(w, sched) if fit_key(w, sched) in fits else w
                row = dict(model=shape.model["name"], tile=tile, sched=sched, workers=w, tasks=int(graph.n_tasks),
                           gaps_real_ms=1e3 * float(start_delays(graph, trace).sum()),
                           gaps_real_trim_ms=1e3 * _trimmed_sum(start_delays(graph, trace)),
                           median_us_by_successors_real=_medians_by_successors(graph, trace),
                           makespan_real_ms=1e3 * float(trace.loc[trace["task"] >= 0, "end_s"].max()),
                           step_real_ms=1e3 * (makespan + host_s))
                for name, h in (("before", _before(host)), ("after", host)):
                    costs = {**fits, key: h}
                    p = predict(cfg, machine, cal, costs, graph=graph, durations=real_d, keep_result=True)
                    row[f"gaps_{name}_ms"] = 1e3 * float(start_delays(graph, p.result.trace()).sum())
                    row[f"makespan_{name}_ms"] = 1e3 * p.makespan_s
                    row[f"median_us_by_successors_{name}"] = _medians_by_successors(graph, p.result.trace())
                    row[f"step_{name}_ms"] = 1e3 * predict(cfg, machine, cal, costs, graph=graph).step_s
                rows.append(row)
                print(f"{row['model']:<12}{tile:>4} {sched:<6}{w:>2}{row['tasks']:>7}  gaps real "
                      f"{row['gaps_real_ms']:7.1f} (98%: {row['gaps_real_trim_ms']:6.1f}) before {row['gaps_before_ms']:7.1f} after {row['gaps_after_ms']:7.1f}"
                      f" ms | step real {row['step_real_ms']:7.1f} before {row['step_before_ms']:7.1f} "
                      f"({100 * (row['step_before_ms'] / row['step_real_ms'] - 1):+.1f}%) after "
                      f"{row['step_after_ms']:7.1f} ({100 * (row['step_after_ms'] / row['step_real_ms'] - 1):+.1f}%)",
                      flush=True)
                print(f"   median gap (us) after a task of {', '.join(f'{lo}-{hi}' for lo, hi in SUCCESSOR_BINS)} "
                      f"successors: real {row['median_us_by_successors_real']} before "
                      f"{row['median_us_by_successors_before']} after {row['median_us_by_successors_after']}",
                      flush=True)
    fitted = {f"{w}:{s}": [float(v) for v in fit_gap_model(t)] for (s, w), t in traced.items()}
    for k, c in fitted.items():
        print(f"fitted on these traces, {k}: " + ", ".join(f"{n} {1e6 * v:.2f} us" for n, v in zip(GAP_TERMS, c)))
    stored = {str(k): [h.task_overhead_s, *h.gap_costs] for k, h in fits.items()
              if h.task_overhead_s is not None}
    load1 = os.getloadavg()
    print(json.dumps(dict(rows=rows, fits=fitted, calibration_fits=stored, terms=list(GAP_TERMS),
                          load_average=[load0[0], load1[0]], conditions=conditions)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
