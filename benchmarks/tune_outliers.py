"""tune's far-off first predictions, taken apart: what each part of a prediction is, and what was fitted on what.

For a few configurations of :mod:`tune_regret`'s shapes (the ones its
first-use run predicted far off, and some it predicted well), ``tune``
calibrates the machine in ``$TILECAST_HOME`` (as tune_regret does: the probe
steps for the schedulers asked, the kernels of the tilings asked) and
predicts them; then each prediction is taken apart:

- the simulated makespan with every cost, without the searches through
  queues (``Machine.push_walk``), and with no cost between tasks at all
  (kernels and dependencies alone);
- the searches the simulation charged (counted in the Python engine: how
  many, how many steps in all, the most in one) at the fitted cost a step;
- the host cost's terms (``fixed + per_tile * tiles + per_task * tasks``);
- the scheduler's probe fit: its costs, and the range of the probes it was
  fitted on (tasks, and the searches' steps counted on them the same way).

``--run`` then measures the same configurations on StarPU (``tune
--execute``'s way: warm-up steps, then timed steps over one or more
sessions) and prints predicted and measured side by side, with the minimum
and median of the timed steps. ``--save FILE`` keeps the measured rows, and
``--load FILE`` predicts them again (with the current code and home) beside
the saved measurements and predictions, without running StarPU. The last
line is one JSON object: ``rows`` (each configuration's parts, in seconds),
``load_average`` (1-minute, before and after) and the conditions.

    python3 benchmarks/tune_outliers.py [--run] [--steps 5] [--warmup 2] [--save rows.json]
    python3 benchmarks/tune_outliers.py --load rows.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tune_regret import SHAPES  # noqa: E402  the same shapes

# (shape, tiling, scheduler, workers): tune_regret's first-use outliers, then rows it predicted well
CASES = [
    ("3x96", "256", "prio", 2),
    ("3x96", "embd=64,inner=64,vocab=64", "prio", 2),
    ("2x128", "32", "dmdas", 1),
    ("3x96", "32", "dmdas", 1),
    ("2x384", "32", "dmdas", 1),
    ("3x96", "256", "eager", 2),
    ("2x128", "256", "eager", 2),
    ("2x128", "256", "prio", 1),
    ("2x384", "batch=256,seq=256,embd=256,head=3,inner=256,vocab=256", "dmdas", 2),
    ("2x384", "32", "dmda", 1),
]


def counted_searches(graph, machine, sched: str, durations) -> tuple[float, list]:
    """(makespan, [(worker, steps)] of every search through a queue the simulation charged or would charge),
    from the Python engine (the C loop counts nothing)."""
    from tilecast.simulator.engine import Engine
    from tilecast.simulator.simulate import simulate

    seen = []
    walk = Engine.walk

    def counting(self, by, walked):
        if walked:
            seen.append((by, walked))
        walk(self, by, walked)

    saved = Engine.walk, Engine.fused_loops, Engine.native_loop
    Engine.walk, Engine.fused_loops, Engine.native_loop = counting, False, False
    try:
        res = simulate(graph, machine, sched, durations=durations)
    finally:
        Engine.walk, Engine.fused_loops, Engine.native_loop = saved
    return res.makespan, seen


def search_summary(seen: list) -> dict:
    steps = np.array([s for w, s in seen if w >= 0], dtype=np.int64)
    return {"searches": int(len(steps)), "steps": int(steps.sum()) if len(steps) else 0,
            "max_steps": int(steps.max()) if len(steps) else 0,
            "mean_steps": float(steps.mean()) if len(steps) else 0.0,
            "by_submitter": int(sum(1 for w, _ in seen if w < 0))}


def decompose(pred, machine, cal, host_costs, graph) -> dict:
    """The parts of one prediction (see the module's docstring)."""
    from tilecast.loop.host_cost import _probe_machine, host_cost_for, probe_graphs, probe_key
    from tilecast.perfmodel.kernel_model import DurationModel
    from tilecast.simulator.simulate import simulate

    c = pred.config
    w = c.workers
    host = host_cost_for(host_costs, w, c.sched)
    mw = machine.with_workers(w)
    m = _probe_machine(host, mw)
    durations = DurationModel(mw, cal).durations(graph)
    full = simulate(graph, m, c.sched, durations=durations).makespan
    no_walk = simulate(graph, m.with_push_walk(0.0), c.sched, durations=durations).makespan
    bare = simulate(graph, mw.with_task_overhead(0.0).with_gap_costs(0.0, 0.0, 0.0, 0.0, 0.0), c.sched,
                    durations=durations).makespan
    from tilecast.loop.candidates import short_label

    out = {"label": f"{c.model.name} {short_label(c.tiling)[:30]} {c.sched} w{w}", "tasks": graph.n_tasks,
           "tiles": graph.n_tiles, "pred_step_s": pred.step_s, "pred_makespan_s": pred.makespan_s,
           "makespan_s": full, "no_walk_s": no_walk, "bare_s": bare, "kernel_sum_s": float(durations[0].sum()),
           "host_fixed_s": host.fixed_s, "host_tiles_s": host.per_tile_s * graph.n_tiles,
           "host_tasks_s": host.per_task_s * graph.n_tasks, "task_overhead_s": host.task_overhead_s,
           "gap_costs": list(host.gap_costs), "submit_task_s": host.submit_task_s, "push_walk_s": host.push_walk_s}
    if host.push_walk_s > 0:
        _, seen = counted_searches(graph, m, c.sched, durations)
        out["searches"] = search_summary(seen)
    probe = host_costs.get(probe_key(w, c.sched))
    if probe is not None:
        pts = np.asarray(probe.points[:probe.probe_points])
        out["probe_tasks"] = [int(pts[:, 1].min()), int(pts[:, 1].max())] if len(pts) else []
        out["probe_makespans_s"] = pts[:, 2].tolist() if len(pts) else []
        if probe.push_walk_s > 0:
            from tilecast.loop.host_cost import SCHED_PROBES

            per = []
            for *_, g in probe_graphs(SCHED_PROBES):
                d = DurationModel(mw, cal).durations(g)
                per.append(search_summary(counted_searches(g, m, c.sched, d)[1]))
            out["probe_searches"] = per
    return out


def show(d: dict) -> None:
    ms = 1e3
    print(f"\n{d['label']}: {d['tasks']} tasks, {d['tiles']} tiles; predicted {d['pred_step_s'] * ms:.1f} ms")
    print(f"  makespan {d['makespan_s'] * ms:.1f} ms (predict(): {d['pred_makespan_s'] * ms:.1f}) = kernels and "
          f"dependencies {d['bare_s'] * ms:.1f} "
          f"(kernel sum {d['kernel_sum_s'] * ms:.1f}) + costs between tasks {(d['no_walk_s'] - d['bare_s']) * ms:.1f}"
          f" + searches {(d['makespan_s'] - d['no_walk_s']) * ms:.1f}")
    print(f"  host {(d['host_fixed_s'] + d['host_tiles_s'] + d['host_tasks_s']) * ms:.2f} ms = fixed "
          f"{d['host_fixed_s'] * ms:.2f} + tiles {d['host_tiles_s'] * ms:.2f} + tasks {d['host_tasks_s'] * ms:.2f}")
    g = d["gap_costs"]
    print(f"  fit: task overhead {d['task_overhead_s'] * 1e6:.2f} us, gaps (start/buf, end/buf, succ, ready, "
          f"handoff) {', '.join(f'{x * 1e6:.2f}' for x in g)} us, submit {d['submit_task_s'] * 1e6:.2f} us/task, "
          f"search {d['push_walk_s'] * 1e9:.1f} ns/step")
    if "searches" in d:
        s = d["searches"]
        print(f"  searches charged: {s['searches']} x {s['mean_steps']:.1f} steps (max {s['max_steps']}) = "
              f"{s['steps']} steps x {d['push_walk_s'] * 1e9:.1f} ns = {s['steps'] * d['push_walk_s'] * ms:.1f} ms"
              f" of worker time ({s['by_submitter']} by the submitting thread, not charged)")
    if d.get("probe_tasks"):
        print(f"  probes fitted on: {d['probe_tasks'][0]}-{d['probe_tasks'][1]} tasks, makespans "
              f"{', '.join(f'{x * ms:.1f}' for x in d['probe_makespans_s'])} ms")
    for i, s in enumerate(d.get("probe_searches", [])):
        print(f"    probe {i}: {s['searches']} searches x {s['mean_steps']:.1f} steps (max {s['max_steps']}) = "
              f"{s['steps']} steps")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="store_true", help="measure the configurations on StarPU too")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--save", metavar="FILE", help="write the decompositions and measured rows here (JSON)")
    ap.add_argument("--load", metavar="FILE", help="predict again beside the measurements saved in FILE")
    ap.add_argument("--no-probe-searches", action="store_true", help="skip counting the probes' searches")
    args = ap.parse_args()
    if args.load and not os.path.isfile(args.load):
        ap.error(f"--load: {args.load} is not a file")
    import tilecast as tc
    from tilecast.loop.execute import execute
    from tilecast.graph import Tiling
    from tilecast.perfmodel.local import conditions_line, run_conditions

    conditions = run_conditions()
    load_before = os.getloadavg()[0]
    print(conditions_line(conditions))
    print(f"load average {load_before:.1f} on {os.cpu_count()} cores; home {os.environ.get('TILECAST_HOME')}")
    saved = json.load(open(args.load)) if args.load else None
    spec = {s[0]: s for s in SHAPES}
    scheds = sorted({c[2] for c in CASES})
    rows = []
    for name in dict.fromkeys(c[0] for c in CASES):
        _, model, batch, seq = spec[name]
        mine = [c for c in CASES if c[0] == name]
        res = tc.tune({**model, "name": name}, batch=batch, seq=seq, tiles=sorted({c[1] for c in mine}),
                      scheds=scheds, workers=[1, 2], progress=True).result
        by = {(p.config.tiling.describe(), p.config.sched, p.config.workers): p for p in res.ranking}
        preds = [by[(Tiling.parse(t).describe(), s, w)] for _, t, s, w in mine]
        for p in preds:
            d = decompose(p, res.machine, res.calibration, res.host_costs, res.graphs[p.config.tiling.describe()])
            if args.no_probe_searches:
                d.pop("probe_searches", None)
            show(d)
            rows.append(d)
        if args.run:
            ex = execute(preds, res.ranking, res.machine, res.calibration, res.host_costs, steps=args.steps,
                         warmup=args.warmup, progress=True)
            for d, r in zip(rows[-len(preds):], ex.rows()):
                timed = [t for rr in r["real_rounds_s"] for t in rr[args.warmup:]]
                d.update(real_step_s=r["real_step_s"], real_min_s=min(timed), real_makespan_s=r["real_makespan_s"],
                         load_average=list(ex.load_average))
    print(f"\n{'configuration':<50}{'predicted':>10}{'min':>9}{'median':>9}{'error':>8}" +
          (f"{'saved pred':>11}{'saved err':>10}" if saved else ""))
    old = dict(enumerate(saved["rows"])) if saved else {}  # the same CASES, in order
    for i, d in enumerate(rows):
        o = old.get(i, {})
        real = d.get("real_step_s", o.get("real_step_s"))
        lo = d.get("real_min_s", o.get("real_min_s"))
        err = f"{100 * (d['pred_step_s'] / real - 1):+7.1f}%" if real else ""
        line = (f"{d['label'][:49]:<50}{d['pred_step_s'] * 1e3:>10.1f}{lo * 1e3 if lo else float('nan'):>9.1f}"
                f"{real * 1e3 if real else float('nan'):>9.1f}{err:>8}")
        if saved and o:
            line += f"{o['pred_step_s'] * 1e3:>11.1f}{100 * (o['pred_step_s'] / real - 1):>+9.1f}%"
        print(line)
    out = {"rows": rows, "load_average": [load_before, os.getloadavg()[0]], "conditions": conditions,
           "loaded_from": args.load}
    if args.save:
        with open(args.save, "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
