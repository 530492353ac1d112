"""Where the CPU of a StarPU-MPI step goes: every thread of every rank, on a core and waiting for one.

Runs ``tilecast run --ranks 2`` (:func:`tilecast.executor.mpi_launch.run_mpi`) on the configurations of
``benchmarks/mpi_forecast.py`` and reads each rank's threads over each step from the scheduler's own counts
(``/proc/self/task/<tid>/schedstat``, :func:`tilecast.executor.mpi_threads.thread_times`): seconds on a core
and seconds runnable but waiting for one, from the barrier's exit to ``starpu_mpi_wait_for_all``'s end. Prints,
per configuration (medians of the steps after the first, the run of median step time), the step's wall time,
each thread group's CPU (``main``: the submitting thread; ``worker``: the threads StarPU names ``CPU <i>``,
StarPU-MPI's progress thread among them where it runs worker 0; ``other``: the rest, Open MPI's and StarPU's
helpers) and the sum of both ranks' CPU over
cores x wall: above 100%, the ranks' threads asked for more than the cores gave. ``--env K=V`` sets a variable
for the runs (e.g. ``OMPI_MCA_mpi_yield_when_idle=1``).

    python3 benchmarks/mpi_thread_cpu.py [--repeats 1] [--steps 4] [--env K=V ...]
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from tilecast.executor.mpi_launch import run_mpi
from tilecast.executor.mpi_threads import thread_groups
from tilecast.graph import Tiling
from tilecast.graph.model_config import load_model
from tilecast.perfmodel.local import conditions_line, run_conditions

MODEL = '{"n_layer":4,"n_embd":128,"n_head":4,"vocab_size":512,"n_positions":128}'
BATCH, SEQ = 4, 64
GROUPS = ("main", "worker", "other")


def summarise(r) -> dict:
    """The run's median step after the first, and per rank and thread group seconds on a core and waiting."""
    steps = r.step_s[1:] or r.step_s
    return {"step_s": float(np.median(steps)),
            "ranks": [{k: {"run_s": v[0], "wait_s": v[1]} for k, v in g.items()} for g in thread_groups(r.threads)]}


def _cell(g: dict) -> str:
    run = " / ".join(f"{1e3 * g[k]['run_s']:.1f}" for k in GROUPS)
    wait = " / ".join(f"{1e3 * g[k]['wait_s']:.1f}" for k in GROUPS)
    return f"{run} ({wait})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--distributions", default="data,layer")
    ap.add_argument("--tiles", default="64,batch=1;128,batch=1;32,batch=1")
    ap.add_argument("--sched", default="lws")
    ap.add_argument("--env", action="append", default=[], metavar="K=V")
    args = ap.parse_args()
    for kv in args.env:
        k, _, v = kv.partition("=")
        os.environ[k] = v
    print(conditions_line(run_conditions()))
    print(f"load average before: {os.getloadavg()[0]:.2f}; env: {' '.join(args.env) or '(none)'}")
    cfg = load_model(MODEL)
    cores = os.cpu_count() or 1
    print(f"{'distribution':<13}{'tiling':<13}{'step ms':>8}  per rank: main / worker / other CPU ms (waiting ms)"
          f"{'':>4}{'CPU/(cores x wall)':>19}")
    rows = []
    for dist in args.distributions.split(","):
        for tile in args.tiles.split(";"):
            runs = [summarise(run_mpi(cfg, BATCH, SEQ, Tiling.parse(tile), args.sched, 1, args.steps, 2, dist,
                                      timeout_s=600, read_threads=True))
                    for _ in range(args.repeats)]
            s = sorted(runs, key=lambda x: x["step_s"])[len(runs) // 2]
            cpu = sum(g[k]["run_s"] for g in s["ranks"] for k in GROUPS)
            ratio = cpu / (cores * s["step_s"])
            cells = "  ".join(_cell(g) for g in s["ranks"])
            print(f"{dist:<13}{tile:<13}{1e3 * s['step_s']:>8.1f}  {cells}{100 * ratio:>8.0f}%", flush=True)
            rows.append(dict(distribution=dist, tiling=tile, cpu_over_cores_wall=ratio, **s))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(json.dumps({"rows": rows, "env": args.env}))


if __name__ == "__main__":
    main()
