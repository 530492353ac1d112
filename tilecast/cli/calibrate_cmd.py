"""tilecast calibrate: time the real kernels on this computer and store the kernel models."""

from __future__ import annotations

import sys
from dataclasses import asdict

import numpy as np
from tqdm import tqdm

from tilecast.cli import UsageError
from tilecast.cli.calibrate_ranks import add_rank_calibration_args, run_rank_calibration
from tilecast.cli.common import (add_json_arg, add_model_args, add_tiles_arg, as_flags, blas_summary, model_args,
                                 print_json, tilings_arg)


def add_parser(sub):
    p = sub.add_parser(
        "calibrate", help="time the kernels on this computer and store its kernel models",
        description="Time the C kernels over the distinct tile shapes of a training step at several tilings, "
                    "the way a step runs them where StarPU runs: as StarPU tasks, one lane of tasks per worker, "
                    "every worker busy, durations from StarPU's profiling (else alone, one BLAS thread); keep "
                    "the median of the repeats, store the result for the local machine (reused by simulate "
                    "and tune), and report each kernel model's error on shapes held out of its fit. A kernel "
                    "with more shapes than --per-kernel, or a set whose timing is estimated above --budget, "
                    "has a design of its shapes timed (the ends of its range of flops and bytes, then the "
                    "shapes farthest from those timed); the others are predicted by the shape model. The "
                    "shapes are added to the machine's stored calibration (shapes timed before are kept). Then "
                    "small probe steps run on StarPU, on every worker count and policy, for the executor's cost "
                    "per task and per step (what simulate adds to a makespan; about a minute, once per machine "
                    "and executor version; --no-probe skips them).")
    add_model_args(p, model="gpt2-tiny", batch=2, seq=128, tile="64")
    add_tiles_arg(p, "32,64,128", "the tilings whose shapes are calibrated besides --tile's (default: 32,64,128)")
    p.add_argument("--repeats", type=int, default=7, metavar="N", help="runs per shape (default: 7)")
    p.add_argument("--per-kernel", type=int, default=16, metavar="N",
                   help="at most N shapes per kernel timed, spread over its flops and bytes (default: 16)")
    p.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help="estimated seconds of timing above which fewer shapes per kernel are timed "
                        "(default: the budget of first use, 360)")
    p.add_argument("--timer", choices=["auto", "starpu", "c", "numpy"], default="auto",
                   help="what runs the kernels: StarPU tasks of the C kernels on every worker (starpu), the C "
                        "kernels alone (c), the numpy references (numpy), or the first of these that works "
                        "here (auto, the default)")
    p.add_argument("--output", metavar="FILE", help="where to write the calibration (default: the machine's store)")
    add_rank_calibration_args(p)
    p.add_argument("--offload-dir", metavar="DIR",
                   help="also time the disk node of memory-limited runs in DIR (StarPU's unistd transfers of "
                        "tile-sized blocks, about a second), then run small probe steps on StarPU under a memory "
                        "limit with the disk node in DIR (about a minute; --no-probe skips them) to fit StarPU's "
                        "own time per task and per tile allocated, read back, written back and evicted, and store "
                        "it all with the calibration (default: $TILECAST_HOME/offload, where a calibration without "
                        "--offload-dir or --disk-only times the file system only)")
    p.add_argument("--disk-only", action="store_true",
                   help="time the disk node only (see --offload-dir: the file system and StarPU's probe steps), "
                        "not the kernels")
    add_json_arg(p)
    return p


def _budget() -> float:
    from tilecast.loop.kernel_calibration import BUDGET_S

    return BUDGET_S


def run(args) -> int:
    if args.ranks is not None:
        return run_rank_calibration(args)
    from tilecast.graph.models import build_step
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.calibration import calibrate, cases_from_shapes, find_calibration
    from tilecast.perfmodel.calibration_design import choose_timed
    from tilecast.perfmodel.kernel_model import holdout_errors
    from tilecast.perfmodel.shapes import graph_shapes
    from tilecast.loop.kernel_calibration import (HOT_PASSES, STARPU_PASSES, estimated_seconds, starpu_workers,
                                                  time_in_starpu, timing_cost_s)
    from tilecast.perfmodel.timers import c_kernel_timer, default_timer, numpy_reference_timer

    cfg, batch, seq, tiling = model_args(args)
    if args.disk_only:
        return _disk(args, load_machine("local"))
    if args.repeats < 1:
        raise UsageError(f"--repeats must be at least 1, got {args.repeats}")
    if args.per_kernel < 1:
        raise UsageError(f"--per-kernel must be at least 1, got {args.per_kernel}")
    budget = _budget() if args.budget is None else args.budget
    if not budget > 0:
        raise UsageError(f"--budget must be a positive number of seconds, got {args.budget}")
    tilings = [tiling] + tilings_arg(args.tiles)
    machine = load_machine("local")
    workers = starpu_workers(machine) if args.timer in ("auto", "starpu") else None
    stored = find_calibration(machine) if args.output is None else None  # what the store holds already
    if args.timer == "starpu" and not workers:
        print("tilecast calibrate: StarPU cannot run here (see tilecast run)", file=sys.stderr)
        return 1
    if workers:
        timer_name, timer = "starpu-tasks", None
    elif args.timer == "numpy":
        timer_name, timer = "numpy-reference", numpy_reference_timer
    else:
        timer = c_kernel_timer()
        timer_name = "c-kernels"
        if timer is None:
            if args.timer == "c":
                print("tilecast calibrate: the C kernels could not be built (see tilecast.kernels.native)",
                      file=sys.stderr)
                return 1
            timer_name, timer = "numpy-reference", numpy_reference_timer
    blas, blas_line = blas_summary()
    shapes = []
    for t in tilings:
        shapes += graph_shapes(build_step(cfg, batch, seq, t))
    seen = cases_from_shapes(shapes)
    est = estimated_seconds(machine, seen)
    cost = timing_cost_s(seen, est, np.full(len(seen), args.repeats + 1), workers or 1,
                         STARPU_PASSES + HOT_PASSES if workers else 1)
    timed, left = choose_timed(seen, cost, budget, cap=args.per_kernel)
    cases, predicted = [seen[i] for i in sorted(timed)], [seen[i] for i in left]
    where = f"as StarPU tasks on {workers} busy workers" if workers else f"with the {timer_name} timer"
    print(f"timing {len(cases)} of {len(seen)} kernel shapes {where}, {args.repeats} runs each", file=sys.stderr)
    with tqdm(total=len(cases), unit="shape", file=sys.stderr, leave=False) as bar:

        def counted(items):
            for item in items:
                yield item
                bar.update(1)

        if workers:
            cal, alone = time_in_starpu(machine, None, cases, np.full(len(cases), args.repeats), workers, bar)
            if alone:  # shapes StarPU cannot run (an empty buffer): timed alone
                alone_name, alone_timer = default_timer()
                cal.add_all(calibrate(machine, alone, repeats=args.repeats, timer=alone_timer,
                                      timer_name=alone_name, progress=counted))
        else:
            cal = calibrate(machine, cases, repeats=args.repeats, timer=timer, timer_name=timer_name,
                            progress=counted)
    for name, row in predicted:
        cal.add_predicted(name, row)
    if stored is not None:  # the new points beside (and, from the same source, over) the stored ones
        quiet = cal.quiet
        stored.add_all(cal)
        stored.quiet, cal = quiet, stored
    path = cal.save(args.output)
    probes = _probe_costs(machine, workers, args) if workers and args.output is None and not args.no_probe else {}
    report = holdout_errors(cal)
    report_hot = holdout_errors(cal, kernels=[k for k in cal.hot if cal.has_hot(k)], lane="hot") if cal.hot else {}
    disk, disk_file, disk_probes = _measure_disk(args, machine)
    out = {"machine": machine.name, "fingerprint": machine.fingerprint(), "timer": timer_name, "file": path,
           "shapes": len(cases), "shapes_seen": len(seen), "shapes_predicted": len(predicted),
           "kernels": len(cal.points), "heldout": report, "heldout_hot": report_hot,
           "cache_bytes": cal.cache_bytes, "blas": blas, "quiet": cal.quiet,
           "disk": {**asdict(disk), "file": disk_file, "probes": disk_probes}, "executor_costs": probes}
    if args.json:
        print_json(out)
        return 0
    print(f"calibrated {len(cases)} shapes of {len(cal.points)} kernels with the {timer_name} timer -> {path}")
    if predicted:
        print(f"{len(predicted)} more shapes of the step are predicted by the shape model (fit corrected by the "
              "nearest timed shapes)")
    print(blas_line)
    if cal.cache_bytes:
        print(f"cache a task's inputs stay hot within: {cal.cache_bytes / 2**20:.2f} MiB per core ({cal.cache_source})")
    if cal.quiet:
        print(quiet_line(cal.quiet))
    print(f"disk node in {disk.directory}: {disk.describe()} -> {disk_file}")
    _print_disk_probes(disk_probes)
    for w, c in probes.items():
        print(f"executor's costs, {w} worker{'s' if int(w) > 1 else ''}: {c['task_overhead_us']:.2f} us per task, "
              f"{c['host_fixed_ms']:.2f} ms per step + {c['host_per_task_us']:.2f} us per task outside the graph")
        print(f"  between a worker's tasks, beyond that: {c['gap_start_buffer_us']:.2f} us per buffer of the task "
              f"starting, {c['gap_end_buffer_us']:.2f} us per buffer, {c['gap_successor_us']:.2f} us per "
              f"successor and {c['gap_ready_us']:.2f} us per successor made ready of the task ended")
    print()
    print("shape model's error on timed shapes held out of its fit:")
    print(f"{'kernel':<16}{'timed/held out':>15}{'median err':>12}{'max err':>10}{'fit alone':>11}{'fixed us':>10}"
          f"{'GFLOP/s':>10}{'GB/s':>10}")
    for title, rows in (("cold", report), ("hot", report_hot)):
        if report_hot:
            print(f"{title} lane times:")
        for name, r in rows.items():
            f = r["fit"]
            print(f"{name:<16}{r['n_fit']:>8}/{r['n_heldout']:<6}{100 * r['median_rel_err']:>11.1f}%"
                  f"{100 * r['max_rel_err']:>9.1f}%{100 * r['base_median_rel_err']:>10.1f}%{f['fixed_us']:>10.2f}"
                  f"{f['gflops']:>10.3g}{f['GBps']:>10.3g}")
    return 0


def _probe_costs(machine, workers: int, args) -> dict:
    """The executor's costs per task and per step, measured on probe steps for every worker count and policy
    (stored for simulate and tune; :func:`tilecast.loop.host_cost.ensure_host_costs`), by worker count."""
    from tilecast.loop.candidates import worker_counts
    from tilecast.loop.host_cost import ensure_host_costs
    from tilecast.loop.tune import usable_scheds
    from tilecast.simulator.simulate import POLICIES

    fits = ensure_host_costs(machine, worker_counts(workers), progress=not args.json,
                             scheds=usable_scheds(list(POLICIES)))
    return {str(w): {"task_overhead_us": (h.task_overhead_s or 0.0) * 1e6, "host_fixed_ms": h.fixed_s * 1e3,
                     "host_per_task_us": h.per_task_s * 1e6, "host_per_tile_us": h.per_tile_s * 1e6,
                     **_gap_costs_us(h)}
            for w, h in fits.items() if isinstance(w, int)}


def _gap_costs_us(h) -> dict:
    """The cost between a worker's tasks beyond ``task_overhead_us``, in microseconds (simulator/gap_cost.py)."""
    return {"gap_start_buffer_us": h.gap_start_buffer_s * 1e6, "gap_end_buffer_us": h.gap_end_buffer_s * 1e6,
            "gap_successor_us": h.gap_successor_s * 1e6, "gap_ready_us": h.gap_ready_s * 1e6}


def _measure_disk(args, machine):
    """(DiskNode, file, probe rows): the disk node timed in --offload-dir (default $TILECAST_HOME/offload), then,
    with --offload-dir or --disk-only (the disk part asked for) and not --no-probe, StarPU's own costs under a
    limit fitted on probe steps there; stored."""
    import os

    from tilecast.home import home
    from tilecast.perfmodel.disk_node import DiskNodeError, measure_and_store, save_disk

    asked = args.offload_dir is not None or args.disk_only
    directory = args.offload_dir
    if directory is None:
        directory = str(home("offload"))
        os.makedirs(directory, exist_ok=True)
    try:
        disk, path = measure_and_store(machine, directory)
    except DiskNodeError as e:
        raise UsageError(as_flags(str(e))) from None
    if args.no_probe or not asked:
        return disk, path, []
    from tilecast.loop.kernel_calibration import starpu_workers

    workers = starpu_workers(machine)
    if not workers:
        print("tilecast calibrate: StarPU cannot run here: the disk node's StarPU costs are not fitted "
              "(the file system's figures alone are stored)", file=sys.stderr)
        return disk, path, []
    from tilecast.perfmodel.disk_fit import PROBES, calibrate_worker_costs

    def progress(i, n, label):
        if not args.json:
            print(f"disk node: probe {i + 1}/{n} under a memory limit ({label})", file=sys.stderr)

    disk, rows = calibrate_worker_costs(machine, disk, directory, PROBES, min(workers, 2), progress)
    return disk, save_disk(machine, disk), rows


def _disk(args, machine) -> int:
    """calibrate --disk-only."""
    disk, path, rows = _measure_disk(args, machine)
    if args.json:
        print_json({"machine": machine.name, "fingerprint": machine.fingerprint(), "disk": {**asdict(disk),
                    "file": path, "probes": rows}})
        return 0
    print(f"disk node in {disk.directory}: {disk.describe()} -> {path}")
    print(f"({disk.source})")
    _print_disk_probes(rows)
    return 0


def _print_disk_probes(rows) -> None:
    """The probe steps the disk node's StarPU costs were fitted on: measured beside forecast."""
    for r in rows:
        print(f"  probe {r['probe']}: {r['measured_step_s']:.3f} s measured, {r['predicted_step_s']:.3f} s "
              f"forecast with the fitted costs ({100 * r['error']:+.0f}%), {r['base_step_s']:.3f} s without them")


def quiet_line(q: dict) -> str:
    """How quiet the machine was while kernels were timed as StarPU tasks, in words."""
    line = (f"quiet check: {q['passes'] - q['passes_disturbed']} of {q['passes']} timing passes undisturbed "
            f"({q['passes_retaken']} retaken, {q['waited_s']:.0f} s waited for slow spells)")
    if q["passes_disturbed"]:
        line += "; the machine stayed slow: the kernel times may be too long"
    return line
