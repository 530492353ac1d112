"""tilecast tune: rank tilings, schedulers and worker counts by simulation; optionally run the best on StarPU."""

from __future__ import annotations

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
    blas_summary,
    human,
    library_errors,
    memory_args,
    model_args,
    parse_list,
    print_json,
    recompute_arg,
    tilings_arg,
)
from tilecast.cli.ranks_table import refuse_with_ranks
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
                    "from the rest of the ranking on StarPU (median of several steps after warm-up; those "
                    "measured within 5% of the fastest are run again as many times, in turns, so that the "
                    "choice between them is not one session's luck) and prints predicted and measured step "
                    "times side by side.")
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
    import tilecast as tc

    cfg, batch, seq, _ = model_args(args)
    if args.ranks is not None:
        refuse_with_ranks(args)
    limit = memory_args(args)
    recompute = recompute_arg(args) if args.recompute is not None else None
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
        return run_tune_ranks(args, cfg, batch, seq, tilings, scheds, recompute or "none")
    if args.top < 1:
        raise UsageError(f"--top must be at least 1, got {args.top}")
    with library_errors({**flags, "recalibrate": "--recalibrate", "quiet_check": "--quiet-check",
                         "memory_limit": "--memory-limit"}):
        res = tc.tune(cfg, batch, seq, args.machine, scheds=scheds, workers=workers, tiles=tilings,
                      max_tasks=args.max_tasks, execute=args.execute, others=args.others, steps=args.steps,
                      warmup=args.warmup, recalibrate=args.recalibrate, progress=True, recompute=recompute,
                      memory_limit=limit.limit_bytes if limit else None,
                      offload_dir=limit.offload_dir if limit else None,
                      offload_io=limit.offload_io if limit else "buffered", quiet_check=args.quiet_check,
                      report=args.out)
    out, result = res.summary, res.result
    if res.execution is not None or res.limited:  # steps ran on StarPU: say which BLAS core timed them
        out["blas"], blas_line = blas_summary()
    if args.json:
        print_json(out)
        return 0
    print_ranking(out, result, args.top)
    if res.limited:
        from tilecast.loop.execute_memory import print_limited

        print()
        print_limited(res.limited)
        print(blas_line)
        if "report" in out:
            print(f"\nreport of the best configuration: {out['report']['html']}")
    if res.execution is not None:
        print()
        from tilecast.cli.tables import print_executed

        print_executed(res.execution)
        print(blas_line)
        if "report" in out:
            print(f"\nreport of the best configuration: {out['report']['html']}")
        if args.recalibrate:
            print(f"models updated from the measured runs: {', '.join(out['calibration_files'])}")
    return 0


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
    shown = result.ranking[:top]
    labels = [short_label(p.config.tiling) + (f" recompute {p.config.recompute}" if "," in out["recompute"] else "")
              for p in shown]
    width = max([30] + [len(label) for label in labels])
    print(f"{'#':>3} {'tiling':<{width}} {'sched':<7}{'wk':>3}{'step ms':>10}{'tokens/s':>11}{'peak mem':>11}"
          f"{'tasks':>8}")
    for i, (p, label) in enumerate(zip(shown, labels)):
        c = p.config
        mem = sum(v for k, v in p.peak_memory_bytes.items() if k != "disk")
        print(f"{i + 1:>3} {label:<{width}} {c.sched:<7}{c.workers:>3}{p.step_s * 1e3:>10.2f}"
              f"{p.tokens_per_s:>11.0f}{human(mem, 'B'):>11}{p.tasks:>8}" + ("" if p.fits else "  over capacity"))
    if len(result.ranking) > top:
        print(f"... {len(result.ranking) - top} more (--top N, --json)")
    if not result.ranking:
        print("no configuration can run under the limit (see the skipped ones above)")
