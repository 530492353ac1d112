"""Where one prediction's wall time goes: the phases of ``predict`` on the configurations of
``vs_starpu_simgrid.py``, from the models stored under ``$TILECAST_HOME`` (no StarPU run).

Each configuration is predicted ``--repeats`` times, as ``vs_starpu_simgrid.py`` times it: in this
process, after a first prediction (imports, the kernels' shape models fitted), each time on a fresh
copy of the graph (dependencies and flops inferred again). The phases are timed exclusively (a phase
called inside another counts for itself only) by wrapping the functions ``predict`` calls:

- ``dependencies``: each task's predecessors inferred from its accesses (``infer_dependencies``);
- ``durations``: the kernel duration model over the graph (``DurationModel.durations``);
- ``loop``: the simulation loop in C (``native.run``, its inputs' packing included);
- ``simulate other``: the rest of ``simulate`` (duration checks, priorities, footprint estimates, the
  gap charges, the summary with its bounds);
- ``predict other``: the rest of ``predict`` (the machine with the measured costs, capacity, host cost).

Medians over the repeats, milliseconds. Prints the conditions, a table and, as its last line, one
JSON object (rows: per configuration its phases and total).

    python3 benchmarks/predict_phases.py [--suite quick|default] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

PHASES = ("dependencies", "durations", "loop", "simulate other", "predict other")


class PhaseClock:
    """Exclusive wall time per phase: a phase entered inside another pauses the outer one."""

    def __init__(self):
        self.spent = dict.fromkeys(PHASES, 0.0)
        self._stack: list = []

    def wrap(self, phase: str, fn):
        def timed(*args, **kwargs):
            now = time.perf_counter()
            if self._stack:
                outer, since = self._stack[-1]
                self.spent[outer] += now - since
            self._stack.append([phase, now])
            try:
                return fn(*args, **kwargs)
            finally:
                end = time.perf_counter()
                self.spent[phase] += end - self._stack.pop()[1]
                if self._stack:
                    self._stack[-1][1] = end
        return timed


def instrument(clock: PhaseClock) -> None:
    """Wrap the functions ``predict`` reaches through module attributes (looked up at call time)."""
    from tilecast.graph import graph as graph_mod
    from tilecast.perfmodel.kernel_model import DurationModel
    from tilecast.simulator import native, simulate

    graph_mod.infer_dependencies = clock.wrap("dependencies", graph_mod.infer_dependencies)
    DurationModel.durations = clock.wrap("durations", DurationModel.durations)
    native.run = clock.wrap("loop", native.run)
    simulate.simulate = clock.wrap("simulate other", simulate.simulate)


def main() -> int:
    from vs_starpu_simgrid import SUITES, configs, fresh

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", choices=sorted(SUITES), default="default")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats: at least 1, got {args.repeats}")

    from tilecast.loop.predict import predict, stored_models
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.local import conditions_line, run_conditions

    conditions = run_conditions()
    print(conditions_line(conditions))
    machine = load_machine("local")
    cal, host = stored_models(machine)
    if cal is None:
        sys.exit("predict_phases: no stored calibration for this machine under $TILECAST_HOME "
                 "(run `tilecast calibrate`, or vs_starpu_simgrid.py once)")
    cfgs = configs(args.suite, args.workers)
    graphs = {}
    for c in cfgs:
        if c.graph_key not in graphs:
            graphs[c.graph_key] = c.build()
    predict(cfgs[0], machine, cal, host, graph=fresh(graphs[cfgs[0].graph_key]))  # first use: imports, fits
    clock = PhaseClock()
    instrument(clock)
    timed = clock.wrap("predict other", predict)
    rows = []
    print(f"{'configuration':<36}{'tasks':>6}" + "".join(f"{p:>16}" for p in PHASES) + f"{'total':>10}  (ms)")
    for c in cfgs:
        per = {p: [] for p in (*PHASES, "total")}
        for _ in range(args.repeats):
            copy = fresh(graphs[c.graph_key])
            clock.spent = dict.fromkeys(PHASES, 0.0)
            t0 = time.perf_counter()
            p = timed(c, machine, cal, host, graph=copy)
            per["total"].append(time.perf_counter() - t0)
            for k, v in clock.spent.items():
                per[k].append(v)
        med = {k: float(np.median(v)) * 1e3 for k, v in per.items()}
        label = f"{c.model.name} {c.batch}x{c.seq} tile {c.tiling.sizes.get('batch', '?')} {c.sched}"
        rows.append({"config": c.label(), "tasks": p.tasks, "makespan_s": p.makespan_s, "ms": med})
        print(f"{label[:35]:<36}{p.tasks:>6}" + "".join(f"{med[k]:>16.2f}" for k in PHASES) + f"{med['total']:>10.2f}")
    total = {k: sum(r["ms"][k] for r in rows) for k in (*PHASES, "total")}
    print(f"{'sum':<42}" + "".join(f"{total[k]:>16.2f}" for k in PHASES) + f"{total['total']:>10.2f}")
    print(json.dumps({"suite": args.suite, "repeats": args.repeats, "sum_ms": total, "rows": rows,
                      "conditions": conditions}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
