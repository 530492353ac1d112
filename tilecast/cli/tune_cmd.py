"""tilecast tune: rank tilings, schedulers and worker counts by simulation; optionally run the best on StarPU."""

from __future__ import annotations

import os

from tilecast.cli import UsageError
from tilecast.cli.common import (
    add_json_arg,
    add_memory_args,
    add_model_args,
    add_out_arg,
    add_recompute_arg,
    add_scheds_arg,
    add_steps_arg,
    add_tiles_arg,
    add_worker_counts_arg,
    add_workers_arg,
    as_flags,
    human,
    memory_args,
    memory_forecast,
    model_args,
    parse_list,
    print_json,
    recompute_arg,
    tilings_arg,
)
from tilecast.errors import FieldError
from tilecast.cli.starpu_errors import with_starpu_errors
from tilecast.cli.tune_ranks import add_tune_rank_args, run_tune_ranks
from tilecast.loop.candidates import short_label


def add_parser(sub):
    from tilecast.loop.candidates import DEFAULT_SCHEDS
    from tilecast.loop.tune import DEFAULT_MAX_TASKS

    p = sub.add_parser(
        "tune", help="search tilings, schedulers and worker counts by simulation; run the best on StarPU",
        description="Simulate the training step under every candidate tiling (uniform tile sizes, and the "
                    "same with batch and sequence whole), scheduler and worker count on a calibrated machine "
                    "model (the local machine is calibrated on first use and cached), and print the "
                    "configurations ranked by predicted step time. --execute K runs the K best and a few "
                    "from the rest of the ranking on StarPU (median of several steps after warm-up) and "
                    "prints predicted and measured step times side by side.")
    add_model_args(p, model="gpt2-tiny", batch=4, seq=64, tile=None)
    add_recompute_arg(p)
    p.set_defaults(recompute=None)  # with --memory-limit and no --recompute, every setting is searched
    p.add_argument("--machine", default="local", metavar="NAME|FILE",
                   help="machine description (default: local, this computer; --execute needs local)")
    add_scheds_arg(p, ",".join(DEFAULT_SCHEDS), ",".join(DEFAULT_SCHEDS))
    add_workers_arg(p, "search only N workers (with --ranks: N per rank; default: --worker-counts)")
    add_worker_counts_arg(p, "1 to the machine's workers")
    add_tiles_arg(p, None, "the tilings to search (default: the candidates above; --tile adds one)")
    p.add_argument("--max-tasks", type=int, default=DEFAULT_MAX_TASKS, metavar="N",
                   help=f"skip tilings whose step has more tasks (default: {DEFAULT_MAX_TASKS})")
    p.add_argument("--top", type=int, default=15, metavar="N", help="rows of the ranking to print (default: 15)")
    p.add_argument("--execute", type=int, default=0, metavar="K",
                   help="run the K best configurations on StarPU, plus --others from the rest of the ranking")
    p.add_argument("--others", type=int, default=2, metavar="N",
                   help="with --execute: also run N configurations spread over the rest of the ranking (default: 2)")
    add_steps_arg(p, 5, "per configuration run by --execute, after --warmup")
    p.add_argument("--warmup", type=int, default=2, metavar="N", help="warm-up steps before timing (default: 2)")
    p.add_argument("--recalibrate", action="store_true",
                   help="with --execute: update the stored kernel models and host-cost fits from the measured "
                        "runs and show the errors before and after")
    p.add_argument("--quiet-check", action="store_true",
                   help="with --execute: run every StarPU session between two reference steps and retake it when "
                        "they show the machine in a slow spell (about 0.6 s more per session; see tilecast "
                        "accuracy --help)")
    add_out_arg(p, None, "the comparison report of the best configuration run by --execute")
    add_tune_rank_args(p)
    add_memory_args(p)
    p.epilog = ("With --memory-limit (and --offload-dir for a disk node) every configuration is simulated with "
                "main memory capped at the limit and StarPU's eviction to the disk node (docs/memory.md), the "
                "recompute settings none, selective and full are all searched unless --recompute names one, and "
                "configurations the limit cannot run (below their smallest working set) are listed as skipped "
                "with the reason. --execute then runs the chosen configurations under the limit (each in its own "
                "StarPU session, --warmup + --steps steps) and prints, per configuration, the predicted and "
                "measured step time and bytes written to and read from the disk node per step, and the peak "
                "RSS; --out DIR compares the best one's forecast with its last measured step, disk traffic "
                "included. --recalibrate and --quiet-check are not available with a limit.")
    add_json_arg(p)
    return p


def parse_tilings(args):
    """The tilings of --tiles and --tile, or None (the candidates)."""
    from tilecast.graph import Tiling, TilingError

    specs = tilings_arg(args.tiles)
    if args.tile:
        try:
            specs.append(Tiling.parse(args.tile))
        except TilingError as e:
            raise UsageError(as_flags(str(e))) from None
    return specs or None


def worker_counts(args):
    """(worker counts to search or None, their field -> flag name) from --workers N or --worker-counts LIST."""
    if args.workers is not None and args.worker_counts:
        raise UsageError("--workers/--worker-counts: give one count (--workers N) or a list (--worker-counts LIST)")
    if args.workers is not None:
        return [args.workers], {"workers": "--workers"}
    if args.worker_counts:
        return parse_list(args.worker_counts, "--worker-counts", int), {"workers": "--worker-counts"}
    return None, {}


@with_starpu_errors("tune")
def run(args) -> int:
    from tilecast.loop import execute, pick_for_execution, tune
    from tilecast.graph.recompute import RECOMPUTE
    from tilecast.perfmodel import MachineError, load_machine

    cfg, batch, seq, _ = model_args(args)
    limit = memory_args(args)
    if args.recompute is not None:
        recomputes = [recompute_arg(args)]
    else:
        recomputes = list(RECOMPUTE) if limit is not None else ["none"]
    tilings = parse_tilings(args)
    scheds = parse_list(args.scheds, "--scheds")
    workers, flags = worker_counts(args)
    flags["tilings"] = "--tiles"
    if args.ranks is not None:
        if args.worker_counts:
            raise UsageError("--worker-counts: not with --ranks (--workers N: workers per rank)")
        for flag, v, low in (("--max-tasks", args.max_tasks, 1), ("--top", args.top, 1)):
            if v < low:
                raise UsageError(f"{flag} must be at least {low}, got {v}")
        return run_tune_ranks(args, cfg, batch, seq, tilings, scheds, recomputes[0])
    for flag, v, low in (("--execute", args.execute, 0), ("--steps", args.steps, 1), ("--warmup", args.warmup, 0),
                         ("--others", args.others, 0), ("--max-tasks", args.max_tasks, 1), ("--top", args.top, 1)):
        if v < low:
            raise UsageError(f"{flag} must be at least {low}, got {v}")
    if args.machine != "local" and args.execute:
        raise UsageError("--execute: only the local machine can be run (drop --machine or --execute)")
    if limit is not None and args.execute:
        for flag, on in (("--recalibrate", args.recalibrate), ("--quiet-check", args.quiet_check)):
            if on:
                raise UsageError(f"{flag}: not available with --memory-limit (drop one of them)")
    try:
        machine = load_machine(args.machine)
    except MachineError as e:
        raise UsageError(f"--machine: {e}") from None
    forecast = memory_forecast(limit, machine)
    results = []
    for rc in recomputes:
        try:
            results.append(tune(cfg, batch, seq, machine, scheds=scheds, workers=workers, tilings=tilings,
                                max_tasks=args.max_tasks, progress=True, recompute=rc, memory=forecast))
        except FieldError as e:
            raise UsageError(as_flags(str(e), flags)) from None
    result = results[0]
    if len(results) > 1:
        from dataclasses import replace

        from tilecast.loop.predict import rank

        result = replace(result, ranking=rank([p for r in results for p in r.ranking]),
                         skipped=[s for r in results for s in r.skipped])
    out = {"model": cfg.name, "batch": batch, "seq": seq, "recompute": ",".join(recomputes),
           "machine": machine.name, "configurations": len(result.ranking), "skipped": result.skipped,
           "memory_limit_bytes": forecast.limit_bytes if forecast else None,
           "offload_dir": limit.offload_dir if limit else None,
           "host_cost": bool(result.host_costs), "ranking": [p.row() for p in result.ranking]}
    execution = limited = None
    if args.execute and limit is not None:
        limited = _execute_limited(args, out, result, machine, limit, forecast)
    elif args.execute:
        from tilecast.loop.interference import QuietGuard

        chosen = pick_for_execution(result.ranking, args.execute, args.others)
        guard = QuietGuard(workers=max(p.config.workers for p in chosen)) if args.quiet_check else None
        execution = execute(chosen, result.ranking, machine, result.calibration, result.host_costs,
                            steps=args.steps, warmup=args.warmup, recalibrate=args.recalibrate, guard=guard)
        out["executed"] = execution.rows()
        if execution.quiet:
            out["quiet"] = execution.quiet
        out["load_average"] = list(execution.load_average)
        if args.recalibrate:
            out["calibration_files"] = execution.save_models(machine)
        if args.out and execution.checked:
            out["report"] = execution.checked[0].comparison().write(args.out)
    if args.json:
        print_json(out)
        return 0
    print_ranking(out, result, args.top)
    if limited is not None:
        from tilecast.loop.execute_memory import print_limited

        print()
        print_limited(limited)
        if "report" in out:
            print(f"\nreport of the best configuration: {out['report']['html']}")
    if execution is not None:
        print()
        from tilecast.cli.tables import print_executed

        print_executed(execution)
        if "report" in out:
            print(f"\nreport of the best configuration: {out['report']['html']}")
        if args.recalibrate:
            print(f"models updated from the measured runs: {', '.join(out['calibration_files'])}")
    return 0


def _execute_limited(args, out, result, machine, limit, forecast) -> list:
    """``--execute`` under ``--memory-limit``: the chosen configurations run under the limit; fills ``out``."""
    from tilecast.loop import pick_for_execution
    from tilecast.loop.execute_memory import execute_limited

    from tilecast.cli.common import as_flags
    from tilecast.executor.memory_limit import MemoryLimitError

    chosen = pick_for_execution(result.ranking, args.execute, args.others)
    load_before = os.getloadavg()[0]
    try:
        runs = execute_limited(chosen, result.ranking, limit, steps=args.steps, warmup=args.warmup)
    except MemoryLimitError as e:
        raise UsageError(as_flags(str(e))) from None
    out["executed"] = [r.row() for r in runs]
    out["load_average"] = [load_before, os.getloadavg()[0]]
    if args.out and runs:
        out["report"] = runs[0].comparison(machine, result.calibration, result.host_costs,
                                           forecast).write(args.out)
    return runs


def print_ranking(out, result, top) -> None:
    print(f"{out['model']}, batch {out['batch']} x {out['seq']}, recompute {out['recompute']} on {out['machine']}: "
          f"{out['configurations']} configurations simulated"
          + ("" if out["host_cost"] else " (kernel time only: StarPU's per-step cost not measured)"))
    if out.get("memory_limit_bytes"):
        print(f"memory limit {human(out['memory_limit_bytes'], 'B')}"
              + (f", disk node in {out['offload_dir']}" if out["offload_dir"] else ", no disk node")
              + ": configurations simulated with eviction; step times of the step after a warm-up step")
    for s in out["skipped"]:
        where = (f" on {s['workers']} workers" if "workers" in s else "") + (
            f" (recompute {s['recompute']})" if s.get("recompute", "none") != "none" else "")
        print(f"  skipped tiling {s['tiling']}{where}: {as_flags(s['reason'])}")
    print()
    print(f"{'#':>3} {'tiling':<30} {'sched':<7}{'wk':>3}{'step ms':>10}{'tokens/s':>11}{'peak mem':>11}"
          f"{'tasks':>8}")
    for i, p in enumerate(result.ranking[:top]):
        c = p.config
        mem = sum(v for k, v in p.peak_memory_bytes.items() if k != "disk")
        label = short_label(c.tiling) + (f" recompute {c.recompute}" if "," in out["recompute"] else "")
        print(f"{i + 1:>3} {label:<30} {c.sched:<7}{c.workers:>3}{p.step_s * 1e3:>10.2f}"
              f"{p.tokens_per_s:>11.0f}{human(mem, 'B'):>11}{p.tasks:>8}" + ("" if p.fits else "  over capacity"))
    if len(result.ranking) > top:
        print(f"... {len(result.ranking) - top} more (--top N, --json)")
    if not result.ranking:
        print("no configuration can run under the limit (see the skipped ones above)")
