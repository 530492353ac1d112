"""prio's cost per level of its priority tree on this machine, from queues of known length (StarPU 1.3.10).

Runs :func:`tilecast.loop.queue_probe.measure`: ``n`` independent tiny tasks
queued before the workers start, under prio with distinct and with equal
priorities, alternately, in one StarPU session per worker count; the
makespan difference over the extra tree levels searched is the cost of a
level (:func:`tilecast.loop.queue_probe.level_cost`). Prints a row per size
and worker count, then one JSON line: ``rows`` (``tasks``, ``workers``,
``distinct_s``, ``equal_s`` in seconds, ``extra_levels``),
``level_cost_s`` per worker count (seconds per level), ``load_average``
(1-minute, before and after), ``shuffled`` and the CPU.

    python3 benchmarks/queue_costs.py [--workers 1,2] [--sizes 1024,4096,16384] [--repeats 5] [--shuffled]
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    ap.add_argument("--sizes", default="1024,4096,16384", help="tasks queued, comma-separated")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each priority set per size")
    ap.add_argument("--shuffled", action="store_true",
                    help="distinct priorities in a random order of the tasks (popped in that order: their "
                         "structures reached out of order too), instead of decreasing in submission order")
    args = ap.parse_args()
    try:
        workers = [int(w) for w in args.workers.split(",")]
        sizes = [int(n) for n in args.sizes.split(",")]
    except ValueError:
        ap.error("--workers and --sizes take comma-separated integers")
    if min(workers) < 1 or min(sizes) < 1 or args.repeats < 1:
        ap.error("--workers, --sizes and --repeats must be at least 1")
    from tilecast.loop.queue_probe import level_cost, measure
    from tilecast.perfmodel.local import conditions_line, run_conditions

    conditions = run_conditions()
    print(conditions_line(conditions))
    load = [os.getloadavg()[0]]
    rows, cost = [], {}
    print(f"{'workers':>7} {'tasks':>6} {'distinct ms':>12} {'equal ms':>9} {'extra levels':>13} {'ns/level':>9}")
    for w in workers:
        mine = measure(w, sizes, args.repeats, shuffled=args.shuffled)
        for r in mine:
            per = (r["distinct_s"] - r["equal_s"]) / r["extra_levels"] if r["extra_levels"] else 0.0
            print(f"{w:>7} {r['tasks']:>6} {r['distinct_s'] * 1e3:>12.2f} {r['equal_s'] * 1e3:>9.2f}"
                  f" {r['extra_levels']:>13} {per * 1e9:>9.1f}")
        rows += mine
        cost[str(w)] = level_cost(mine)
        print(f"workers {w}: {cost[str(w)] * 1e9:.1f} ns per tree level (least squares over the sizes)")
    load.append(os.getloadavg()[0])
    print(json.dumps({"rows": rows, "level_cost_s": cost, "shuffled": args.shuffled, "load_average": load, "conditions": conditions}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
