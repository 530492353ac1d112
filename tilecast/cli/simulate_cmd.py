"""tilecast simulate: predict a training step on a machine model with a StarPU policy."""

from __future__ import annotations

import os
import sys
import time

from tilecast.cli import UsageError
from tilecast.cli.common import add_json_arg, add_model_args, human, model_args, print_json

DEFAULT_OUT = "tilecast-sim"


def add_parser(sub):
    from tilecast.simulator.simulate import POLICIES

    p = sub.add_parser(
        "simulate", help="predict a training step's execution on a machine model",
        description="Build the tiled task graph of one GPT-2 training step and simulate it on a machine "
                    "description with one of StarPU's scheduling policies: workers, data replicas per memory "
                    "node, transfers over links. Prints the predicted step time and a summary, and writes the "
                    "predicted trace (table and Chrome JSON).")
    add_model_args(p)
    p.add_argument("--machine", default="local", metavar="NAME|FILE",
                   help="machine description: local (this computer, detected), a shipped name "
                        "(a100-sxm4-80gb-8, h100-sxm5-80gb-8, h200-sxm-141gb-8) or a YAML file (default: local)")
    p.add_argument("--workers", type=int, metavar="N", help="use the machine's first N workers (default: all)")
    p.add_argument("--sched", default="dmda", choices=list(POLICIES), metavar="NAME",
                   help=f"scheduling policy: {', '.join(POLICIES)} (default: dmda)")
    p.add_argument("--compare-policies", action="store_true",
                   help="simulate every policy and print one row each (no trace is written)")
    p.add_argument("--calibration", metavar="FILE",
                   help="kernel calibration file (default: the one stored for this machine, if any)")
    p.add_argument("--no-transfers", action="store_true", help="ignore data placement (every node holds every tile)")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="PREFIX",
                   help=f"write the trace to PREFIX.parquet and PREFIX.json (Chrome/Perfetto) (default: {DEFAULT_OUT})")
    p.add_argument("--no-trace", action="store_true", help="do not write trace files")
    p.add_argument("--seed", type=int, default=0, help="seed of the random policy (default: 0)")
    add_json_arg(p)
    return p


def _machine(args):
    from tilecast.perfmodel import MachineError, load_machine

    try:
        m = load_machine(args.machine)
        if args.workers is not None:
            m = m.with_workers(args.workers)
    except MachineError as e:
        raise UsageError(f"--machine/--workers: {e}") from None
    return m


def _calibration(args, machine):
    from tilecast.perfmodel.calibration import Calibration, CalibrationError, find_calibration

    if args.calibration:
        try:
            return Calibration.load(args.calibration, machine.fingerprint())
        except CalibrationError as e:
            raise UsageError(f"--calibration: {e}") from None
    return find_calibration(machine)


def _figures(s: dict, sim_s: float) -> dict:
    out = {"step_s": s["makespan_s"], **s, "simulation_s": sim_s}
    return out


def _with_measured_overhead(machine, sched: str):
    """The machine with the runtime's cost per task measured on StarPU traces of this scheduler, where
    stored (the local machine, after ``tune``, ``accuracy`` or ``demo``); else as described."""
    if machine.name == "local":
        from tilecast.loop.host_cost import measured_task_overhead

        seconds = measured_task_overhead(machine, sched)
        if seconds is not None:
            return machine.with_task_overhead(seconds), "measured on StarPU traces"
    return machine, "machine description"


def run(args) -> int:
    from tilecast.graph.gpt2 import build_gpt2_step
    from tilecast.perfmodel.kernel_model import DurationModel
    from tilecast.simulator import SimulationError
    from tilecast.simulator.simulate import POLICIES, simulate
    from tilecast.trace import save

    cfg, batch, seq, tiling = model_args(args)
    machine = _machine(args)
    calibration = _calibration(args, machine)
    print(f"building {cfg.name} step, batch {batch} x {seq}, tiling {tiling}", file=sys.stderr)
    graph = build_gpt2_step(cfg, batch, seq, tiling)
    model = DurationModel(machine, calibration)
    durations = model.durations(graph)
    provenance = dict(model.provenance)
    scheds = list(POLICIES) if args.compare_policies else [args.sched]
    rows = []
    result = None
    for sched in scheds:
        print(f"simulating {graph.n_tasks} tasks on {machine.name} ({len(machine.workers)} workers) with {sched}",
              file=sys.stderr)
        m, overhead_source = _with_measured_overhead(machine, sched)
        t0 = time.perf_counter()
        try:
            result = simulate(graph, m, sched, durations=durations, transfers=not args.no_transfers,
                              seed=args.seed)
        except SimulationError as e:
            print(f"tilecast simulate: {e}", file=sys.stderr)
            return 1
        rows.append({**_figures(result.summary, time.perf_counter() - t0),
                     "task_overhead_us": m.task_overhead * 1e6, "task_overhead_source": overhead_source})
    common = {"model": cfg.name, "batch": batch, "seq": seq, "tiling": tiling.describe(),
              "calibration": "stored" if calibration is not None else "none (machine roofline figures)",
              "duration_sources": provenance}
    if args.compare_policies:
        if args.json:
            print_json({**common, "policies": rows})
            return 0
        _print_header(common, machine)
        print(f"{'policy':<8}{'step':>12}{'util %':>8}{'transfers':>11}{'moved':>12}{'sim s':>8}")
        for r in rows:
            print(f"{r['sched']:<8}{r['step_s'] * 1e3:>10.2f}ms{100 * r['utilization']:>8.1f}{r['transfers']:>11}"
                  f"{human(r['bytes_moved'], 'B'):>12}{r['simulation_s']:>8.2f}")
        return 0
    out = {**common, **rows[0]}
    if not args.no_trace:
        print("writing the trace", file=sys.stderr)
        trace = result.trace()
        table = save(trace, f"{args.out}.parquet")
        chrome = save(trace, f"{args.out}.json", graph if graph.n_tasks <= 200_000 else None)
        out["trace"] = {"table": os.path.abspath(table), "chrome": os.path.abspath(chrome)}
    if args.json:
        print_json(out)
        return 0
    _print_summary(common, machine, out)
    return 0


def _print_header(common, machine) -> None:
    print(f"{common['model']}, batch {common['batch']} x {common['seq']}, tiling {common['tiling']}; "
          f"{machine.name}: {len(machine.workers)} workers, {len(machine.nodes)} memory nodes; "
          f"kernel durations: {common['calibration']}")


def _print_summary(common, machine, s) -> None:
    _print_header(common, machine)
    print()
    print(f"predicted step      {s['step_s'] * 1e3:.3f} ms  ({s['sched']})")
    print(f"lower bounds        critical path {s['critical_path_s'] * 1e3:.3f} ms, "
          f"work / workers {s['work_bound_s'] * 1e3:.3f} ms")
    print(f"tasks               {s['tasks']}  ({human(s['flops'])}flop, "
          f"{human(s['flops'] / max(s['step_s'], 1e-30))}flop/s)")
    print(f"utilization         {100 * s['utilization']:.1f} %")
    print(f"cost per task       {s['task_overhead_us']:.2f} us ({s['task_overhead_source']})")
    print(f"transfers           {s['transfers']} ({human(s['bytes_moved'], 'B')}), "
          f"{s['evictions']} evictions, {s['writebacks']} write-backs")
    print()
    print(f"{'worker':<12}{'busy ms':>10}{'idle ms':>10}")
    for w, b, i in zip(machine.workers, s["busy_s"], s["idle_s"]):
        print(f"{w.name:<12}{b * 1e3:>10.3f}{i * 1e3:>10.3f}")
    if s["bytes_per_link"]:
        print()
        print(f"{'link':<28}{'moved':>12}")
        for name, b in s["bytes_per_link"].items():
            print(f"{name:<28}{human(b, 'B'):>12}")
    print()
    print(f"{'memory node':<12}{'peak':>12}")
    for name, b in s["peak_memory_bytes"].items():
        print(f"{name:<12}{human(b, 'B'):>12}")
    print(f"simulated in        {s['simulation_s']:.2f} s")
    if "trace" in s:
        print(f"trace               {s['trace']['table']}, {s['trace']['chrome']}")
