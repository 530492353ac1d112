"""tilecast simulate: predict a training step on a machine model with a StarPU policy."""

from __future__ import annotations

import os
import sys

from tilecast.cli import UsageError
from tilecast.cli.common import (add_json_arg, add_memory_args, add_model_args, add_out_arg, add_recompute_arg,
                                 add_workers_arg, human,
                                 memory_args, model_args, print_json,
                                 recompute_arg)
from tilecast.api.policies import prediction_row
from tilecast.cli.ranks_table import add_rank_args, refuse_with_ranks
from tilecast.cli.simulate_ranks import add_network_arg, run_ranks

DEFAULT_OUT = "tilecast-sim"
TRACE_FILES = ("trace.parquet", "trace.json")  # under --out


def add_parser(sub):
    from tilecast.simulator.simulate import POLICIES

    p = sub.add_parser(
        "simulate", help="predict a training step's execution on a machine model",
        description="Build the tiled task graph of one GPT-2 training step and simulate it on a machine "
                    "description with one of StarPU's scheduling policies: workers, data replicas per memory "
                    "node, transfers over links. Prints the predicted step time (the simulated makespan plus the "
                    "executor's host cost per step, predicted as tilecast tune predicts it: measured on StarPU "
                    "on the local machine, unknown elsewhere) and a summary, and writes the predicted trace "
                    "(table and Chrome JSON).")
    add_model_args(p)
    add_recompute_arg(p)
    p.add_argument("--machine", default="local", metavar="NAME|FILE",
                   help="machine description: local (this computer, detected), a shipped name "
                        "(a100-sxm4-80gb-8, h100-sxm5-80gb-8, h200-sxm-141gb-8) or a YAML file (default: local)")
    add_workers_arg(p, "the machine's first N (default: all)")
    p.add_argument("--sched", default="dmda", choices=list(POLICIES), metavar="NAME",
                   help=f"scheduling policy: {', '.join(POLICIES)} (default: dmda)")
    p.add_argument("--compare-policies", action="store_true",
                   help="simulate every policy and print one row each (no trace is written)")
    p.add_argument("--calibration", metavar="FILE",
                   help="kernel calibration file (default: the one stored for this machine, if any)")
    p.add_argument("--no-transfers", action="store_true", help="ignore data placement (every node holds every tile)")
    add_out_arg(p, DEFAULT_OUT, f"the predicted trace, {TRACE_FILES[0]} (for tilecast compare) and {TRACE_FILES[1]} "
                                "(Chrome/Perfetto)")
    p.add_argument("--no-trace", action="store_true", help="do not write the trace files")
    p.add_argument("--sched-seed", type=int, default=0, metavar="N",
                   help="seed of the random scheduling policy's choices (default: 0)")
    add_rank_args(p, "predict the step on N StarPU-MPI ranks of --workers workers each (default 1), joined by "
                     "the network tilecast calibrate --ranks measured: owner-computes placement, StarPU-MPI's "
                     "cache of received tiles, each rank's own --sched (docs/mpi.md)")
    add_network_arg(p)
    add_memory_args(p)
    p.epilog = ("With --memory-limit and --offload-dir, the step is simulated with main memory capped at the limit "
                "and StarPU's eviction of tiles to a disk node in the directory (its speed measured by tilecast "
                "calibrate on the same file system, else measured now and stored), after a warm-up step: the "
                "summary adds evictions, write-backs and bytes written to and read from the disk "
                "(docs/memory.md). A limit below the step's smallest working set is refused in one line with the "
                "minimum.")
    add_json_arg(p)
    return p


def _machine(args):
    """The machine as described (all its workers: its stored models are keyed by it) and the worker count."""
    from tilecast.perfmodel import MachineError, load_machine

    try:
        m = load_machine(args.machine)
        workers = len(m.workers) if args.workers is None else len(m.with_workers(args.workers).workers)
    except MachineError as e:
        raise UsageError(f"--machine/--workers: {e}") from None
    return m, workers


def _models(args, machine):
    """(kernel calibration, host-cost fits): those stored for the machine, or --calibration's file."""
    from tilecast.loop.predict import stored_models
    from tilecast.perfmodel.calibration import Calibration, CalibrationError

    calibration, host_costs = stored_models(machine)
    if calibration is None and not args.calibration:
        from tilecast.perfmodel.calibration import stale_calibration

        stale = stale_calibration(machine)
        if stale:  # an older calibration format: said once, then the roofline figures are used
            print(f"tilecast simulate: {stale}; predicting from the machine's roofline meanwhile", file=sys.stderr)
    if args.calibration:
        try:
            calibration = Calibration.load(args.calibration, machine.fingerprint())
        except CalibrationError as e:
            raise UsageError(f"--calibration: {e}") from None
    return calibration, host_costs


def run(args) -> int:
    cfg, batch, seq, tiling = model_args(args)
    recompute = recompute_arg(args)
    if args.ranks is not None:
        if args.compare_policies:
            raise UsageError("--compare-policies: not with --ranks (give one --sched)")
        refuse_with_ranks(args)
        return run_ranks(args, cfg, batch, seq, tiling, recompute)
    limit = memory_args(args)  # bad sizes and directories before anything is built
    machine, workers = _machine(args)
    if args.compare_policies:
        return _compare_policies(args, cfg, batch, seq, tiling, recompute, machine, workers)
    return _simulate(args, cfg, batch, seq, tiling, recompute, machine, workers, limit)


def _simulate(args, cfg, batch, seq, tiling, recompute, machine, workers, limit) -> int:
    """One policy: ``tc.simulate``, its figures printed and its trace written."""
    import tilecast as tc
    from tilecast.cli.common import library_errors
    from tilecast.perfmodel.calibration import CalibrationError
    from tilecast.simulator import SimulationError
    from tilecast.trace import save

    _models(args, machine)  # a bad --calibration in one line, and a stale stored one noted, before any work
    print(f"building {cfg.name} step, batch {batch} x {seq}, tiling {tiling}, recompute {recompute}; simulating on "
          f"{machine.name} ({workers} workers) with {args.sched}", file=sys.stderr)
    try:
        with library_errors():  # a limit below the step's smallest working set names the minimum
            res = tc.simulate(cfg, batch, seq, tiling, machine, args.sched, args.workers, args.calibration,
                              transfers=not args.no_transfers, sched_seed=args.sched_seed, recompute=recompute,
                              memory_limit=limit.limit_bytes if limit else None,
                              offload_dir=limit.offload_dir if limit else None,
                              offload_io=limit.offload_io if limit else "buffered")
    except CalibrationError as e:
        raise UsageError(f"--calibration: {e}") from None
    except SimulationError as e:
        print(f"tilecast simulate: {e}", file=sys.stderr)
        return 1
    pred, graph = res.prediction, res.graph
    common = {"model": cfg.name, "batch": batch, "seq": seq, "tiling": tiling.describe(), "recompute": recompute,
              "calibration": res.calibration, "duration_sources": res.duration_sources,
              "memory_limit_bytes": limit.limit_bytes if limit else None,
              "offload_dir": args.offload_dir if limit else None, "offload_io": limit.offload_io if limit else None}
    out = {**prediction_row(pred, machine, res.simulation_s), **common}
    if not args.no_trace:
        print("writing the trace", file=sys.stderr)
        trace = res.trace()  # with the predicted step time, kept in the Parquet file for tilecast compare
        try:
            os.makedirs(args.out, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--out: cannot write {args.out}: {e.strerror or e}") from None
        table = save(trace, os.path.join(args.out, TRACE_FILES[0]))
        chrome = save(trace, os.path.join(args.out, TRACE_FILES[1]), graph if graph.n_tasks <= 200_000 else None)
        out["trace"] = {"table": os.path.abspath(table), "chrome": os.path.abspath(chrome)}
    if args.json:
        print_json(out)
        return 0
    _print_summary(common, machine, out)
    return 0


def _compare_policies(args, cfg, batch, seq, tiling, recompute, machine, workers) -> int:
    """Every policy on one graph and one set of task durations (``tc.simulate_policies``)."""
    import tilecast as tc
    from tilecast.cli.common import library_errors
    from tilecast.perfmodel.calibration import CalibrationError
    from tilecast.simulator import SimulationError

    _models(args, machine)  # a bad --calibration in one line, and a stale stored one noted, before any work
    limit = memory_args(args)
    print(f"building {cfg.name} step, batch {batch} x {seq}, tiling {tiling}, recompute {recompute}", file=sys.stderr)

    def progress(sched, tasks):
        print(f"simulating {tasks} tasks on {machine.name} ({workers} workers) with {sched}", file=sys.stderr)

    try:
        with library_errors():
            res = tc.simulate_policies(cfg, batch, seq, tiling, machine, args.workers, args.calibration,
                                       transfers=not args.no_transfers, sched_seed=args.sched_seed,
                                       recompute=recompute, memory_limit=limit.limit_bytes if limit else None,
                                       offload_dir=limit.offload_dir if limit else None,
                                       offload_io=limit.offload_io if limit else "buffered", progress=progress)
    except CalibrationError as e:
        raise UsageError(f"--calibration: {e}") from None
    except SimulationError as e:
        print(f"tilecast simulate: {e}", file=sys.stderr)
        return 1
    rows = res.rows
    common = {"model": cfg.name, "batch": batch, "seq": seq, "tiling": tiling.describe(), "recompute": recompute,
              "calibration": res.calibration, "duration_sources": res.duration_sources,
              "memory_limit_bytes": res.memory_limit_bytes,
              "offload_dir": args.offload_dir if limit else None, "offload_io": limit.offload_io if limit else None}
    if args.json:
        print_json({**common, "policies": rows})
        return 0
    _print_header(common, machine, workers)
    print(f"{'policy':<8}{'step':>12}{'makespan':>12}{'host':>10}{'util %':>8}{'transfers':>11}{'moved':>12}"
          f"{'sim s':>8}")
    for r in rows:
        host = f"{r['host_s'] * 1e3:.2f}ms" if r["host_known"] else "?"
        print(f"{r['sched']:<8}{r['step_s'] * 1e3:>10.2f}ms{r['makespan_s'] * 1e3:>10.2f}ms"
              f"{host:>10}{100 * r['utilization']:>8.1f}{r['transfers']:>11}"
              f"{human(r['bytes_moved'], 'B'):>12}{r['simulation_s']:>8.2f}")
    print(f"step = makespan + host cost; host cost: {rows[0]['host_cost']}" if not rows[0]["host_known"]
          else "step = makespan + host cost (" + "; ".join(sorted({r['host_cost'] for r in rows})) + ")")
    return 0


def _print_header(common, machine, workers) -> None:
    print(f"{common['model']}, batch {common['batch']} x {common['seq']}, tiling {common['tiling']}, "
          f"recompute {common['recompute']}; "
          f"{machine.name}: {workers} workers, {len(machine.nodes)} memory nodes; "
          f"kernel durations: {common['calibration']}")


def _print_summary(common, machine, s) -> None:
    _print_header(common, machine, s["workers"])
    print()
    print(f"predicted step      {s['step_s'] * 1e3:.3f} ms  ({s['sched']}, {s['workers']} workers)")
    print(f"  makespan          {s['makespan_s'] * 1e3:.3f} ms  (the tasks, simulated)")
    host = f"{s['host_s'] * 1e3:.3f} ms  ({s['host_cost']})" if s["host_known"] else s["host_cost"]
    print(f"  host cost         {host}")
    print(f"lower bounds        critical path {s['critical_path_s'] * 1e3:.3f} ms, "
          f"work / workers {s['work_bound_s'] * 1e3:.3f} ms")
    print(f"tasks               {s['tasks']}  ({human(s['flops'])}flop, "
          f"{human(s['flops'] / max(s['step_s'], 1e-30))}flop/s)")
    print(f"utilization         {100 * s['utilization']:.1f} %")
    print(f"cost per task       {s['task_overhead_us']:.2f} us ({s['task_overhead_source']})")
    print(f"transfers           {s['transfers']} ({human(s['bytes_moved'], 'B')}), "
          f"{s['evictions']} evictions, {s['writebacks']} write-backs")
    if s.get("memory_limit_bytes") is not None:
        if "disk_written_bytes" in s:
            print(f"memory limit        {human(s['memory_limit_bytes'], 'B')} of main memory, disk node in "
                  f"{common['offload_dir']} ({s['disk_node']}); the step after a warm-up step: "
                  f"{human(s['disk_written_bytes'], 'B')} written to disk, {human(s['disk_read_bytes'], 'B')} "
                  f"read, {s['dropped']} clean tiles dropped")
            if s.get("page_cache"):
                print(f"  page cache        {s['page_cache']}: {s['page_cache_read_misses']} of "
                      f"{s['page_cache_read_misses'] + s['page_cache_read_hits']} reads from the device, writers "
                      f"waited for write-back during {s['page_cache_throttled_wall_s']:.3f} s "
                      f"({s['page_cache_throttled_writes']} writes)")
        else:
            print(f"memory limit        {human(s['memory_limit_bytes'], 'B')}, no disk node: every tile fits")
    print()
    print(f"{'worker':<12}{'busy ms':>10}{'idle ms':>10}")
    for w, b, i in zip(machine.workers[:s["workers"]], s["busy_s"], s["idle_s"]):
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
