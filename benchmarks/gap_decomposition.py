"""Where a step's worker time goes, measured and predicted: kernels, waits for inputs, the runtime between tasks.

Measures a few accuracy-suite configurations on StarPU (each in ``--rounds``
sessions of a warm-up and ``--steps`` timed steps, the last timed steps of
each session traced), learns from those traces as ``tilecast accuracy``'s
repeatability view does (:func:`tilecast.loop.execute.learn_from_measurements`)
and predicts each configuration from the calibration alone (first use), from
the learned models (learned), and with the traced durations themselves
(traced: every task its own measured duration, so that only what the
simulation puts between tasks differs from the real step). First use and
learned are predicted twice, with the cost between tasks fitted on the same
traced probe steps (``tilecast calibrate``'s scheduler probes, run here
before the configurations) without the handoff term (``*_before``: the
model as it was) and with it (``*_after``; :mod:`tilecast.simulator.gap_cost`).

Each worker's makespan is split exactly (:func:`decompose`) into

- ``busy``: its tasks' durations;
- ``wait``: time it was free before the task it ran next had its inputs
  written (the task's last predecessor ending), which the schedule decides;
- ``turnaround``: from the end of its task to the start of the next, when
  that next task was ready before the worker was free (the runtime's cost
  between two tasks of one worker);
- ``latency``: from the next task's inputs being written to its start, when
  the worker was free before them (its last predecessor then ran on another
  worker): the time a task released by one worker takes to start on another,
  free one;
- ``head`` and ``tail``: before its first task, after its last.

The same split of the measured traces (median over the traced steps) and of
each prediction's simulated trace shows which part the simulation misses.
Needs StarPU; calibrates what it lacks in ``$TILECAST_HOME`` first. Prints a
table, then one JSON line: ``rows`` (per configuration: ``real`` and per
view the parts summed over the workers in ms, ``step_ms``, ``error`` (of the
predicted step against the measured median), ``latency_n`` and
``latency_median`` (us): the count and median of the tasks in ``latency``,
``handoff_n``: tasks whose last predecessor ran on another worker;
``turnaround_by_bytes``: per bin of the bytes of the task a worker ran
before a turnaround (under 128 KiB, to 1 MiB, to 2 MiB, beyond), [count,
median us, mean us] or null; ``gap_fits_us``: the two fits), ``conditions``.

    python3 benchmarks/gap_decomposition.py [--configs gpt2-4x128:32:eager;...] [--workers 1,2] [--steps 6]
        [--rounds 2] [--save runs.pkl | --load runs.pkl]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from learning_repeat import configs_of, measure_all  # noqa: E402  (the same configurations and measurements)

DEFAULT = ("gpt2-4x128:32:eager", "gpt2-4x128:batch=2,seq=32,embd=64,inner=64,vocab=256:ws")
PARTS = ("busy", "wait", "turnaround", "latency", "head", "tail")
# bins of the bytes of the task a worker ran before a turnaround (:func:`turnaround_by_bytes`): a core's
# level-1 and level-2 caches hold about the first; past 2 MiB a task has streamed more than this
# machine's level 2 holds (2 MiB a core on the 2-core Xeon)
AFTER_BYTES = (0, 128 << 10, 1 << 20, 2 << 20, float("inf"))
from tilecast.loop.runtime_overhead import GAP_TERMS  # noqa: E402

VIEWS = ("first_use_before", "first_use_after", "learned_before", "learned_after", "traced")
LONG_S = 100e-6  # a time between tasks longer than this: the worker was preempted (a time slice is milliseconds)


def decompose(graph, trace, submit_end: float = 0.0, long_s: float = LONG_S) -> dict:
    """Each part of :data:`PARTS` summed over the workers (s), the makespan, and the count and median (s) of the
    tasks in ``latency``; per worker the parts add up to the makespan. Beside them: ``between_submitting``, the
    turnaround and latency of the tasks that started before ``submit_end`` (while the graph was being
    submitted), and ``between_long`` / ``between_long_n``, those of them over ``long_s`` (a worker preempted)."""
    tasks = trace[trace["task"] >= 0].sort_values(["start_s", "task"], kind="stable")
    n = graph.n_tasks
    start, end = np.full(n, np.nan), np.full(n, np.nan)
    ids = tasks["task"].to_numpy()
    start[ids], end[ids] = tasks["start_s"].to_numpy(), tasks["end_s"].to_numpy()
    pred_ptr, pred = (np.asarray(a, dtype=np.int64) for a in graph.dependencies)
    ready = np.zeros(n)
    has = np.diff(pred_ptr) > 0
    if len(pred):
        ready[has] = np.maximum.reduceat(end[pred], pred_ptr[:-1][has])
    makespan = float(np.nanmax(end[ids]))
    out = {k: 0.0 for k in PARTS}
    per_worker = []  # [busy, idle] of each worker
    lat, between, began, turn, turn_after = [], [], [], [], []
    nbytes = np.zeros(n)
    nbytes[ids] = tasks["bytes"].to_numpy()
    for w, rows in tasks.groupby("worker", sort=True):
        t = rows["task"].to_numpy()
        out["busy"] += float((end[t] - start[t]).sum())
        per_worker.append([float((end[t] - start[t]).sum()), makespan - float((end[t] - start[t]).sum())])
        out["head"] += float(start[t[0]])
        out["tail"] += makespan - float(end[t[-1]])
        free, nxt = end[t[:-1]], t[1:]
        r = ready[nxt]
        after = r > free  # the worker was free before the task's inputs were written
        out["wait"] += float((r - free)[after].sum())
        turn.append((start[nxt] - free)[~after])
        out["turnaround"] += float(turn[-1].sum())
        turn_after.append(nbytes[t[:-1]][~after])
        lat.append((start[nxt] - r)[after])  # r > free: the last predecessor ran on another worker
        between.append(np.where(after, start[nxt] - r, start[nxt] - free))
        began.append(start[nxt])
    v = np.concatenate(lat) if lat else np.zeros(0)
    out["latency"] = float(v.sum())
    out["latency_n"] = int(len(v))
    out["latency_median"] = float(np.median(v)) if len(v) else None
    between, began = np.concatenate(between), np.concatenate(began)
    out["between_submitting"] = float(between[began < submit_end].sum())
    out["between_long"] = float(between[between > long_s].sum())
    out["between_long_n"] = int((between > long_s).sum())
    made_on = np.full(n, -1, dtype=np.int64)  # the worker of each task's last predecessor to end
    worker = np.full(n, -1, dtype=np.int64)
    worker[ids] = tasks["worker"].to_numpy()
    if len(pred):
        of = np.repeat(np.arange(n), np.diff(pred_ptr))
        last = end[pred] == ready[of]
        made_on[of[last]] = worker[pred[last]]
    out["handoff_n"] = int(((made_on >= 0) & (made_on != worker)).sum())
    out["per_worker"] = per_worker
    out["turnaround_by_bytes"] = turnaround_by_bytes(np.concatenate(turn), np.concatenate(turn_after))
    out["makespan"] = makespan
    out["workers"] = int(tasks["worker"].nunique())
    return out


def turnaround_by_bytes(gaps: np.ndarray, before: np.ndarray) -> list:
    """[count, median s, mean s] of the turnarounds ``gaps`` in each bin of :data:`AFTER_BYTES` by the bytes
    ``before`` of the task that ended each (None where a bin is empty). On the 2-core Xeon a worker's
    turnaround grew with them (one worker, 2026-12-04: about 3 us after tasks of 0.1-0.2 MB, 4 us after
    1 MB, 7-11 us after 2-4 MB), where the probes the cost between tasks is fitted on hold tiles of a
    few kilobytes (docs/predicting.md)."""
    out = []
    for lo, hi in zip(AFTER_BYTES[:-1], AFTER_BYTES[1:]):
        g = gaps[(before >= lo) & (before < hi)]
        out.append([int(len(g)), float(np.median(g)), float(g.mean())] if len(g) else None)
    return out


def _bins_label() -> list:
    def size(b):
        return "inf" if b == float("inf") else f"{b / 2**20:g}M" if b >= 1 << 20 else f"{b / 2**10:g}K"
    return [f"{size(lo)}-{size(hi)}" for lo, hi in zip(AFTER_BYTES[:-1], AFTER_BYTES[1:])]


def _ms(parts: dict) -> dict:
    """The parts and makespan in ms, the medians in us, the counts as they are."""
    out = {}
    for k, v in parts.items():
        if v is None:
            out[k] = None
        elif k == "turnaround_by_bytes":
            out[k] = [None if b is None else [b[0], round(1e6 * b[1], 2), round(1e6 * b[2], 2)] for b in v]
        elif k == "per_worker":
            out[k] = [[round(1e3 * x, 3) for x in w] for w in v]
        elif k in PARTS or k in ("makespan", "between_submitting", "between_long"):
            out[k] = round(1e3 * v, 3)
        elif k.endswith("_median"):
            out[k] = round(1e6 * v, 2)
        else:
            out[k] = int(round(v))
    return out


def probe_gap_fits(configs, repeats: int = 5) -> dict:
    """Per (workers, policy) of ``configs``: the cost between tasks fitted on the same traced probe steps
    (``tilecast calibrate``'s scheduler probes, run here) without the handoff ("before") and with it ("after"):
    {(w, sched): {"before": coefficients, "after": coefficients}} in :data:`GAP_TERMS` order (s)."""
    from tilecast.loop.host_cost import SCHED_PROBES, measure_probes
    from tilecast.loop.runtime_overhead import GAP_TERMS, fit_gap_model

    out = {}
    for w, sched in sorted({(c.workers, c.sched) for c in configs}):
        print(f"probe steps: {sched} on {w} worker(s)", file=sys.stderr)
        traced = measure_probes(w, SCHED_PROBES, repeats, sched)[2]
        out[(w, sched)] = {"before": fit_gap_model(traced, terms=GAP_TERMS[:-1]).tolist(),
                           "after": fit_gap_model(traced).tolist()}
    return out


def with_gap_fits(fits: dict, gaps: dict, which: str) -> dict:
    """The host-cost fits with each (workers, policy)'s cost between tasks replaced by ``gaps``' ``which`` fit
    (under the worker count's key for eager, whose probes are the worker count's, and the policy's keys)."""
    from dataclasses import replace

    from tilecast.loop.host_cost import PROBE_SCHED, fit_key, probe_key

    out = dict(fits)
    for (w, sched), g in gaps.items():
        c = g[which]
        for key in (fit_key(w, sched), probe_key(w, sched)) + ((w,) if sched == PROBE_SCHED else ()):
            if key in out:
                h = replace(out[key])
                h.task_overhead_s = c[0]
                h.set_gap_costs(c[1:])
                out[key] = h
    return out


def evaluate(configs, measurements, gaps) -> list:
    """Per configuration, the measured parts and those of each view's prediction: first use and learned, with
    the cost between tasks fitted without the handoff (``*_before``) and with it (``*_after``), and the traced
    durations with it."""
    from tilecast.loop.execute import learn_from_measurements
    from tilecast.loop.host_cost import calibrated_only, host_cost_for, load_host_costs
    from tilecast.loop.predict import predict
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.calibration import find_calibration

    machine = load_machine("local")
    cal_all, host_all = find_calibration(machine), load_host_costs(machine)
    cal0 = cal_all.calibrated_only()
    models = {}
    for which in ("before", "after"):
        host0 = with_gap_fits(calibrated_only(host_all), gaps, which)
        models[f"first_use_{which}"] = (cal0, host0)
        models[f"learned_{which}"] = learn_from_measurements(configs, measurements, machine, cal0, host0)
    rows = []
    for c, m in zip(configs, measurements):
        g = m.graph
        h = host_cost_for(models["first_use_after"][1], c.workers, c.sched)
        sub = h.submit_task_s * g.n_tasks if h is not None else 0.0  # when the submission ends, as simulated
        real = [decompose(g, t[(t["task"] >= 0) & (t["source"] == "real")], sub) for t in m.traces]
        med = {k: (float(np.median([r[k] for r in real if r[k] is not None]))
                   if any(r[k] is not None for r in real) else None) for k in real[0]
               if k not in ("per_worker", "turnaround_by_bytes")}
        med["per_worker"] = np.median([r["per_worker"] for r in real], axis=0).tolist()
        med["turnaround_by_bytes"] = real[-1]["turnaround_by_bytes"]  # the last traced step's
        last = m.traces[-1]
        last = last[last["task"] >= 0]
        traced = np.zeros((1, g.n_tasks))
        traced[0, last["task"].to_numpy()] = (last["end_s"] - last["start_s"]).to_numpy()
        row = {"config": c.label(), "model": c.model.name, "sched": c.sched, "workers": c.workers,
               "tasks": int(g.n_tasks), "submit_end_ms": round(1e3 * sub, 3),
               "gap_fits_us": {k: [round(1e6 * v, 3) for v in f] for k, f in gaps[(c.workers, c.sched)].items()},
               "real": {**_ms(med), "step_ms": round(1e3 * m.median_s, 3), "host_ms": round(1e3 * m.host_s, 3)}}
        views = {v: dict(calibration=cal, host_costs=host) for v, (cal, host) in models.items()}
        views["traced"] = dict(calibration=models["learned_after"][0], host_costs=models["learned_after"][1],
                               durations=traced)
        for v, kw in views.items():
            p = predict(c, machine, kw["calibration"], kw["host_costs"], graph=g, durations=kw.get("durations"),
                        keep_result=True)
            row[v] = {**_ms(decompose(g, p.result.trace(), sub)), "step_ms": round(1e3 * p.step_s, 3),
                      "host_ms": round(1e3 * p.host_s, 3),
                      "error": round((p.step_s - m.median_s) / m.median_s, 4)}
        rows.append(row)
    return rows


def print_table(rows) -> None:
    head = f"{'':<17}{'step':>8}{'error':>8}{'mkspan':>8}" + "".join(f"{k:>11}" for k in PARTS)
    for r in rows:
        print(f"\n{r['config']} ({r['tasks']} tasks, submitted until {r['submit_end_ms']:.1f} ms as simulated)")
        print("  cost between tasks fitted on the probes (us; " + ", ".join(GAP_TERMS) + "): "
              + "; ".join(f"{k} {v}" for k, v in r["gap_fits_us"].items()))
        print(head + f"{'n_lat':>7}{'med_lat':>9}{'host':>7}{'submitting':>11}{'long':>8}{'n_long':>7}"
              f"{'handoffs':>9}  busy/idle per worker")
        for v in ("real",) + VIEWS:
            p = r[v]
            err = f"{100 * p['error']:>+7.1f}%" if "error" in p else f"{'':>8}"
            print(f"{v:<17}{p['step_ms']:>8.2f}{err}{p['makespan']:>8.2f}" + "".join(f"{p[k]:>11.2f}" for k in PARTS)
                  + f"{p['latency_n']:>7}{(p['latency_median'] or 0):>9.2f}{p['host_ms']:>7.2f}"
                  + f"{p['between_submitting']:>11.2f}{p['between_long']:>8.2f}{p['between_long_n']:>7}"
                  + f"{p['handoff_n']:>9}  " + " ".join(f"{b:.1f}/{i:.1f}" for b, i in p["per_worker"]))
        print(f"  turnaround after the task before it, by its bytes (median / mean us, count): "
              + "; ".join(f"{label} " + ("-" if b is None else f"{b[1]:.2f} / {b[2]:.2f} ({b[0]})")
                          for label, b in zip(_bins_label(), r["real"]["turnaround_by_bytes"]))
              + " measured; " + "; ".join(("-" if b is None else f"{b[1]:.2f} / {b[2]:.2f}")
                                           for b in r["first_use_after"]["turnaround_by_bytes"]) + " first use")
    print("\n(ms summed over the workers; per worker busy + wait + turnaround + latencies + head + tail = makespan; "
          "n_lat: tasks whose worker was free before their inputs were written (by another worker), med_lat: their "
          "median latency in us; host: step less makespan; submitting: turnaround and latency of the tasks started "
          "during the submission; long: those over 100 us, n_long their count; handoffs: tasks whose last predecessor "
          "ran on another worker; busy/idle per worker: its tasks' durations and the rest of the makespan; real: median "
          "over the traced steps; turnaround by bytes: the last traced step's)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default=";".join(DEFAULT),
                    help="model:tiling:sched, separated by ';' (model: an accuracy-suite shape)")
    ap.add_argument("--workers", default="1,2", help="worker counts (default 1,2)")
    ap.add_argument("--steps", type=int, default=6, help="timed steps per session (default 6)")
    ap.add_argument("--rounds", type=int, default=2, help="StarPU sessions per configuration (default 2)")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up steps per session (default 1)")
    ap.add_argument("--save", help="pickle the configurations and measurements to this file")
    ap.add_argument("--load", help="evaluate the measurements pickled in this file instead of measuring")
    args = ap.parse_args(argv)
    load_before = os.getloadavg()[0]
    if args.load:
        with open(args.load, "rb") as f:
            configs, measurements, measured, gaps = pickle.load(f)
    else:
        from tilecast.loop.host_cost import ensure_host_costs
        from tilecast.loop.kernel_calibration import ensure_calibration
        from tilecast.perfmodel import load_machine

        configs = configs_of([s for s in args.configs.split(";") if s], [int(w) for w in args.workers.split(",")])
        machine = load_machine("local")
        ensure_calibration(machine, [c.build() for c in configs])
        ensure_host_costs(machine, sorted({c.workers for c in configs}), scheds=sorted({c.sched for c in configs}))
        load_before = os.getloadavg()[0]
        gaps = probe_gap_fits(configs)
        measurements = measure_all(configs, args.steps, args.rounds, args.warmup)
        measured = {"load_average_before": load_before, "load_average_after": os.getloadavg()[0]}
        if args.save:
            with open(args.save, "wb") as f:
                pickle.dump((configs, measurements, measured, gaps), f)
    from tilecast.perfmodel.local import conditions_line, run_conditions

    conditions = run_conditions()
    print(conditions_line(conditions), f"; load average while measuring {measured['load_average_before']:.2f} "
          f"before, {measured['load_average_after']:.2f} after")
    rows = evaluate(configs, measurements, gaps)
    print_table(rows)
    print(json.dumps({"rows": rows, "conditions": {**measured, **conditions}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
