"""tilecast calibrate: time the real kernels on this computer and store the kernel models."""

from __future__ import annotations

import sys

from tilecast.cli import UsageError
from tilecast.cli.calibrate_ranks import add_rank_calibration_args, run_rank_calibration
from tilecast.cli.common import (add_json_arg, add_model_args, add_tiles_arg, blas_summary, library_errors,
                                 model_args, print_json, tilings_arg)


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
                        "tile-sized blocks, about a second), the computing time the disk traffic takes from "
                        "threads that fill the cores and the rate the device takes the page cache's write-back at "
                        "(1 GiB of tiles written and synced, read from the device and from the cache beside them, "
                        "about 10 s, removed after), then run small probe steps on StarPU "
                        "under a memory limit with the disk node in DIR (about a minute; --no-probe skips the "
                        "computing time and them) to fit StarPU's own time per task and per tile "
                        "allocated, read back, written back and evicted, and, where --tile's tiles are at least "
                        "four times the probes' (--tile 128 and up), one more probe of tiles of that size, fitted "
                        "alone, for steps of such tiles; store it all with the calibration (default: "
                        "$TILECAST_HOME/offload, where a calibration without "
                        "--offload-dir or --disk-only times the file system only)")
    p.add_argument("--offload-io", choices=["buffered", "direct"], default="buffered",
                   help="with --offload-dir: direct also runs the disk node's probe steps with the tiles' files "
                        "written with O_DIRECT, fitting StarPU's costs for run/simulate --offload-io direct "
                        "(about a minute more); default: buffered only")
    p.add_argument("--disk-only", action="store_true",
                   help="time the disk node only (see --offload-dir: the file system and StarPU's probe steps), "
                        "not the kernels")
    p.add_argument("--check", action="store_true",
                   help="time nothing to store: run the quiet check's reference step (a small gpt2-tiny step on "
                        "StarPU) 5 times now, about 2 s, and compare its median with the reference step the stored "
                        "calibration was timed beside; exit 1 when they differ by more than 12%%, since forecasts "
                        "from that calibration then carry the difference (calibrate again, or wait for the "
                        "machine's usual speed)")
    add_json_arg(p)
    return p


CALIBRATE_FLAGS = {"repeats": "--repeats", "per_kernel": "--per-kernel", "budget": "--budget", "timer": "--timer",
                   "offload_io": "--offload-io", "offload_dir": "--offload-dir", "disk_only": "--disk-only"}


def run(args) -> int:
    import tilecast as tc
    from tilecast.kernels.native_build import NativeUnavailable

    if args.check:
        return run_check(args)
    if args.ranks is not None:
        return run_rank_calibration(args)
    if args.offload_io == "direct" and (args.no_probe or (args.offload_dir is None and not args.disk_only)):
        raise UsageError("--offload-io needs --offload-dir (or --disk-only) and the probes (not --no-probe)")
    cfg, batch, seq, tiling = model_args(args)
    tilings = tilings_arg(args.tiles)
    try:
        with library_errors(CALIBRATE_FLAGS):
            res = tc.calibrate(cfg, batch, seq, tiling, tilings, args.repeats, args.per_kernel, args.budget,
                               args.timer, args.output, args.offload_dir, args.disk_only, probe=not args.no_probe,
                               progress=not args.json, offload_io=args.offload_io)
    except NativeUnavailable as e:
        print(f"tilecast calibrate: {e}", file=sys.stderr)
        return 1
    out, cal, disk = res.summary, res.calibration, res.disk
    if args.disk_only:
        if args.json:
            print_json(out)
            return 0
        print(f"disk node in {disk['directory']}: {res.disk_node.describe()} -> {disk['file']}")
        print(f"({disk['source']})")
        _print_disk_probes(disk.get("probes", []))
        return 0
    cases, path, timer_name, probes = res.shapes, res.file, res.timer, res.executor_costs
    report, report_hot = out["heldout"], out["heldout_hot"]
    _, blas_line = blas_summary()
    if args.json:
        print_json(out)
        return 0
    print(f"calibrated {cases} shapes of {res.kernels} kernels with the {timer_name} timer -> {path}")
    if res.shapes_predicted:
        print(f"{res.shapes_predicted} more shapes of the step are predicted by the shape model (fit corrected by the "
              "nearest timed shapes)")
    print(blas_line)
    if cal.cache_bytes:
        print(f"cache a task's inputs stay hot within: {cal.cache_bytes / 2**20:.2f} MiB per core ({cal.cache_source})")
    if cal.llc_bytes:
        print(f"shared cache a task's inputs come back from (near, not cold) within: {cal.llc_bytes / 2**20:.0f} MiB "
              f"per core ({cal.llc_source})")
    if cal.in_step_source:
        from tilecast.loop.step_probe import in_step_line

        print(in_step_line(cal))
    if cal.quiet:
        print(quiet_line(cal.quiet))
    print(f"disk node in {disk['directory']}: {res.disk_node.describe()} -> {disk['file']}")
    _print_disk_probes(disk.get("probes", []))
    for w, c in probes.items():
        print(f"executor's costs, {w} worker{'s' if int(w) > 1 else ''}: {c['task_overhead_us']:.2f} us per task, "
              f"{c['host_fixed_ms']:.2f} ms per step + {c['host_per_task_us']:.2f} us per task outside the graph")
        print(f"  between a worker's tasks, beyond that: {c['gap_start_buffer_us']:.2f} us per buffer of the task "
              f"starting, {c['gap_end_buffer_us']:.2f} us per buffer, {c['gap_successor_us']:.2f} us per "
              f"successor and {c['gap_ready_us']:.2f} us per successor made ready of the task ended"
              + (f"; {c['gap_handoff_us']:.2f} us per task started on another worker than the one that made it "
                 "ready" if int(w) > 1 else ""))
        if c.get("gap_end_us_per_mib", 0.0) > 0:
            print(f"  after a task of many bytes: {c['gap_end_us_per_mib']:.2f} us per MiB it accessed, up to "
                  f"{c['gap_byte_cap_bytes'] / 2**20:.1f} MiB (the step probe's gaps beyond the model above)")
        if "prio_tree_level_ns" in c:
            print(f"  prio's priority tree: {c['prio_tree_level_ns']:.1f} ns a level searched by each push and pop "
                  "(measured on queues of known length)")
        if "sorted_walk_far_ns" in c and c["sorted_walk_ns"] > 0:
            queue = c.get("sorted_walk_queue_ns", 0.0)
            source = ("measured on a queue of known length in random order" if c["sorted_walk_ns"] <= 1.01 * queue
                      else f"as its longest probe paid them beside dmda; {queue:.2f} ns on a queue of known length")
            print(f"  dmdas's sorted insertions: {c['sorted_walk_ns']:.2f} ns a queued task walked past over the first "
                  f"{c['sorted_walk_knee']:.0f}, {c['sorted_walk_far_ns']:.2f} ns beyond ({source})")
        elif "sorted_walk_far_ns" in c:
            print("  dmdas's sorted insertions: not charged apart (its own cost per task reproduced its probes "
                  "better than a walk)")
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


CHECK_ALONE = {"ranks": "--ranks", "output": "--output", "offload_dir": "--offload-dir", "disk_only": "--disk-only"}


def run_check(args) -> int:
    """``calibrate --check``: the machine's speed now against its stored calibration's; exit 1 beyond 12%."""
    import tilecast as tc

    clash = [flag for name, flag in CHECK_ALONE.items() if getattr(args, name) not in (None, False)]
    if clash:
        raise UsageError(f"--check: times nothing to store, so it takes no {', '.join(clash)}")
    with library_errors():
        res = tc.check_speed()
    if args.json:
        print_json(res.to_dict())
    else:
        print(res.line)
    return 0 if res.within else 1


def quiet_line(q: dict) -> str:
    """How quiet the machine was while kernels were timed as StarPU tasks, in words."""
    line = (f"quiet check: {q['passes'] - q['passes_disturbed']} of {q['passes']} timing passes undisturbed "
            f"({q['passes_retaken']} retaken, {q['waited_s']:.0f} s waited for slow spells)")
    if q.get("reference_s"):
        line += (f"; reference step {q['reference_s'] * 1e3:.1f} ms around the passes (fastest seen "
                 f"{q['reference_best_s'] * 1e3:.1f} ms)")
    if q.get("lane_figures_again"):
        line += f"; {q['lane_figures_again']} hot or near figures that stood out from their neighbours timed again"
    if q["passes_disturbed"]:
        line += "; the machine stayed slow: the kernel times may be too long"
    return line


def _print_disk_probes(rows) -> None:
    """The probe steps the disk node's StarPU costs were fitted on: measured beside forecast."""
    for r in rows:
        on = f" on {r['workers']} worker{'s' if r['workers'] > 1 else ''}" if "workers" in r else ""
        on += ", O_DIRECT" if r.get("offload_io") == "direct" else ""
        print(f"  probe {r['probe']}{on}: {r['measured_step_s']:.3f} s measured, {r['predicted_step_s']:.3f} s "
              f"forecast with the fitted costs ({100 * r['error']:+.0f}%), {r['base_step_s']:.3f} s without them")
