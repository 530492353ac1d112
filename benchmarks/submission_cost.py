"""The submitting thread's seconds per task: the host-cost probes against the accuracy suite's steps.

The forecast charges the executor's submitting thread one cost per task
(``HostCost.submit_task_s``; with as many workers as cores it takes turns on a
worker's core, :mod:`tilecast.simulator.submit_slices`), measured on the
host-cost probes (:data:`tilecast.loop.host_cost.PROBES`) and taken from the
one with the most tasks (:func:`tilecast.loop.host_cost.long_submission_per_task`).
This prints, per graph, that cost as ``tcs_submit`` times it (the median of a
fresh StarPU session's steps after the first; eager), for every probe and for
each distinct graph of the accuracy suite, and what the probes' median and the
longest probe give. Each graph runs in a session of its own, as the suite runs
its configurations. ``--paused`` submits every graph before the workers start
(``submit_paused``), so that nothing runs beside the submitting thread.

Last line: one JSON object (per graph: tasks, tiles, megabytes of tiles, seconds per task).

    python3 benchmarks/submission_cost.py [--workers 1] [--steps 5] [--paused] [--quick]
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def graphs(quick: bool) -> list:
    """[(label, model config, batch, seq, graph)]: the probes, then each distinct graph of the suite."""
    from tilecast.loop.accuracy_suite import suite_configs
    from tilecast.loop.host_cost import PROBES, probe_graphs

    out = [(f"probe {cfg.name} {b}x{s} tile {t}", cfg, b, s, g)
           for (cfg, b, s, g), (_, _, _, t) in zip(probe_graphs(PROBES), PROBES)]
    seen = {}
    for c in suite_configs("quick" if quick else "full"):
        seen.setdefault(c.graph_key, c)
    for c in seen.values():
        out.append((f"suite {c.model.name} {c.batch}x{c.seq} {c.tiling}", c.model, c.batch, c.seq, c.build()))
    return out


def submission_per_task(cfg, batch: int, seq: int, graph, workers: int, steps: int, paused: bool) -> list:
    """Seconds per task of each step's submission after the first, in a fresh session."""
    from tilecast.executor.starpu_run import StarPUTraining
    from tilecast.executor.starpu_session import StarPUSession
    from tilecast.reference.step import TrainState, init_params

    with StarPUSession("eager", workers) as session:
        if paused:
            execute = session.execute
            session.execute = lambda *a, **k: execute(*a, **{**k, "submit_paused": True})
        data = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(steps + 2, batch, seq + 1))
        training = StarPUTraining(session, graph, TrainState(init_params(cfg, 0)), data)
        seconds = []
        for _ in range(steps + 1):
            training.step(trace=False)
            seconds.append(session.last_submit_s)
    return [s / graph.n_tasks for s in seconds[1:]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per graph, after one warm-up (default 5)")
    ap.add_argument("--max-step-s", type=float, default=1.0,
                    help="graphs whose step takes longer run 2 timed steps only (default 1 s)")
    ap.add_argument("--paused", action="store_true", help="submit every graph before the workers start")
    ap.add_argument("--quick", action="store_true", help="the quick suite's graphs instead of the full suite's")
    args = ap.parse_args()

    from tilecast.loop.host_cost import long_submission_per_task
    from tilecast.perfmodel.local import conditions_line, run_conditions

    print(conditions_line(run_conditions()))
    print(f"eager, {args.workers} worker(s){', submitted paused' if args.paused else ''}; "
          f"us per task, median of the timed steps (min-max)")
    rows = []
    for label, cfg, batch, seq, graph in graphs(args.quick):
        big = graph.flops.sum() > 5e10  # steps of seconds on these machines
        per = submission_per_task(cfg, batch, seq, graph, args.workers, 2 if big else args.steps, args.paused)
        row = dict(label=label, tasks=graph.n_tasks, tiles=graph.n_tiles,
                   mb=round(float(graph.tile_nbytes.sum()) / 1e6, 1), per_task_s=float(np.median(per)),
                   min_s=float(min(per)), max_s=float(max(per)))
        rows.append(row)
        print(f"{label:64s} {row['tasks']:6d} tasks {row['tiles']:6d} tiles {row['mb']:8.1f} MB "
              f"{row['per_task_s'] * 1e6:6.2f} ({row['min_s'] * 1e6:.2f}-{row['max_s'] * 1e6:.2f})", flush=True)
    probes = [r for r in rows if r["label"].startswith("probe")]
    suite = [r for r in rows if r["label"].startswith("suite")]
    median = float(np.median([r["per_task_s"] for r in probes]))
    longest = long_submission_per_task([(r["tasks"], r["per_task_s"] * r["tasks"]) for r in probes])
    lo, hi = min(r["per_task_s"] for r in suite), max(r["per_task_s"] for r in suite)
    print(f"probes' median {median * 1e6:.2f} us, longest probe {longest * 1e6:.2f} us; "
          f"the suite's graphs {lo * 1e6:.2f}-{hi * 1e6:.2f} us "
          f"(median {np.median([r['per_task_s'] for r in suite]) * 1e6:.2f})")
    print(json.dumps(dict(workers=args.workers, paused=args.paused, probes_median_s=median,
                          longest_probe_s=longest, rows=rows)))


if __name__ == "__main__":
    main()
