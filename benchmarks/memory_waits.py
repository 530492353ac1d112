"""Where a memory-limited step's time goes: the workers' waits per task, measured beside the forecast's.

Runs ``--warmup`` + ``--steps`` steps of one configuration under ``--memory-limit`` with a disk node
(tracing the timed steps: StarPU's profiling of every task, no FxT) and forecasts the step
(:func:`tilecast.loop.predict_memory.predict_limited`). For every task, its delay (its start less the
moment its worker was free and its predecessors done: :func:`tilecast.loop.disk_fit.task_delays`)
is summed by what the simulator says its worker did in main memory first (read a tile back from disk,
wrote one back, evicted clean, allocated only, nothing), measured beside simulated; the disk
transfers per step, measured (StarPU's bus counters) beside simulated; and the costs per event that the
measured delays imply beyond the forecast's (:func:`tilecast.loop.disk_fit.fit_event_costs`).

Last line: one JSON object: ``step_s`` (measured steps), ``predicted_step_s``, ``busy_s`` / ``delay_s``
(summed over tasks, measured median step and simulated), ``groups`` (rows of the table), ``disk``
(measured and predicted transfers and bytes per step), ``extra_costs_s`` (seconds per event) and the
conditions.

    python3 benchmarks/memory_waits.py --model gpt2-tiny --batch 4 --seq 128 --tile 32 --memory-limit 4MiB
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from tilecast.executor.memory_limit import OFFLOAD_IO, MemoryLimit, parse_size
from tilecast.executor.starpu_run import run_steps
from tilecast.graph import Tiling
from tilecast.graph.model_config import load_model
from tilecast.loop.predict_memory import predict_limited
from tilecast.loop.disk_fit import delay_table, fit_event_costs, task_delays
from tilecast.perfmodel.local import conditions_line, run_conditions

from offload_dir import offload_directory  # benchmarks/, beside this script


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2-tiny")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--tile", default="32")
    ap.add_argument("--memory-limit", default="4MiB", metavar="SIZE")
    ap.add_argument("--recompute", default="none", choices=["none", "selective", "full"])
    ap.add_argument("--sched", default="dmda")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--offload-dir", default=None, metavar="DIR",
                    help="disk node directory (default: a new directory under $TILECAST_HOME/offload, "
                         "removed at the end)")
    ap.add_argument("--offload-io", default="buffered", choices=OFFLOAD_IO,
                    help="the disk node's files through the page cache (buffered) or O_DIRECT (direct)")
    args = ap.parse_args()
    cfg, tiling, limit = load_model(args.model), Tiling.parse(args.tile), parse_size(args.memory_limit)
    with offload_directory(args.offload_dir, "waits-") as offload:
        conditions = run_conditions()
        print(conditions_line(conditions))
        p = predict_limited(cfg, args.batch, args.seq, tiling, args.sched, args.workers, limit, offload,
                            args.recompute, keep_result=True, offload_io=args.offload_io)
        sim = p.result
        g = sim.graph
        pred_ptr, pred = g.dependencies
        res = run_steps(cfg, args.batch, args.seq, tiling, args.sched, args.workers, args.warmup + args.steps,
                        memory=MemoryLimit(limit, offload, args.offload_io), recompute=args.recompute,
                        trace_from=args.warmup)
    sim_delay = task_delays(sim.start, sim.end, sim.worker, pred_ptr, pred)
    real_delays, busy = [], []
    for tr in res.traces:
        t = tr[tr["task"] >= 0].sort_values("task")
        assert len(t) == g.n_tasks, "the trace has one row per task"
        real_delays.append(task_delays(t["start_s"].to_numpy(), t["end_s"].to_numpy(), t["worker"].to_numpy(),
                                       pred_ptr, pred))
        busy.append(float((t["end_s"] - t["start_s"]).sum()))
    events = sim.task_events
    rows = delay_table(real_delays, sim_delay, events)
    costs = fit_event_costs(real_delays, sim_delay, events)
    s = sim.summary
    timed = slice(args.warmup, None)
    disk = {"real_writes": float(np.median(res.disk_writes[timed])),
            "real_reads": float(np.median(res.disk_reads[timed])),
            "real_written_bytes": float(np.median(res.disk_written[timed])),
            "real_read_bytes": float(np.median(res.disk_read[timed])),
            "pred_writes": s["disk_writes"], "pred_reads": s["disk_reads"],
            "pred_written_bytes": s["disk_written_bytes"],
            "pred_read_bytes": s["disk_read_bytes"], "pred_evictions": s["evictions"], "pred_dropped": s["dropped"],
            "pred_allocations": s["allocations"]}
    steps = res.step_s[timed]
    print(f"{cfg.name} batch {args.batch}x{args.seq} tile {args.tile} limit {args.memory_limit}: {g.n_tasks} tasks; "
          f"steps {', '.join(f'{x:.3f}' for x in steps)} s measured, {p.step_s:.3f} s predicted")
    print(f"tasks' busy time {np.median(busy):.3f} s measured, {float((sim.end - sim.start).sum()):.3f} s simulated; "
          f"delays {np.median([d.sum() for d in real_delays]):.3f} s measured, {sim_delay.sum():.3f} s simulated")
    print(f"disk transfers per step: writes {disk['real_writes']:.0f} measured / {disk['pred_writes']} predicted, "
          f"reads {disk['real_reads']:.0f} / {disk['pred_reads']}; bytes read "
          f"{disk['real_read_bytes'] / 2**20:.2f} / {disk['pred_read_bytes'] / 2**20:.2f} MiB; predicted "
          f"{disk['pred_evictions']} evictions ({disk['pred_dropped']} clean), {disk['pred_allocations']} allocations")
    print(f"{'tasks whose worker first':<26}{'tasks':>7}{'delay meas s':>14}{'delay sim s':>13}")
    for r in rows:
        print(f"{r['group']:<26}{r['tasks']:>7}{r['real_s']:>14.3f}{r['sim_s']:>13.3f}")
    print("extra cost per event (measured less simulated delay, NNLS): "
          + ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in costs.items()))
    print(json.dumps({"model": cfg.name, "batch": args.batch, "seq": args.seq, "tiling": args.tile,
                      "memory_limit": args.memory_limit, "offload_io": args.offload_io, "tasks": int(g.n_tasks),
                      "step_s": steps,
                      "predicted_step_s": p.step_s, "busy_s": {"real": float(np.median(busy)),
                                                               "sim": float((sim.end - sim.start).sum())},
                      "delay_s": {"real": float(np.median([d.sum() for d in real_delays])),
                                  "sim": float(sim_delay.sum())},
                      "groups": rows, "disk": disk, "extra_costs_s": costs, "conditions": conditions}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
