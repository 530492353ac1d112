"""``tilecast compare PRED REAL``: how far a predicted trace is from a measured one, and why."""

from __future__ import annotations

from tilecast.cli import UsageError
from tilecast.cli.common import add_json_arg, add_out_arg, as_flags, print_json


def add_parser(subparsers):
    p = subparsers.add_parser(
        "compare", help="compare a predicted trace with a measured one and write a report",
        description="Compare a predicted (simulated) trace with a measured one of the same graph: "
                    "step time error (when the traces record it: .parquet files of tilecast simulate --out and "
                    "tilecast run --trace), makespan error, per-kernel duration errors, busy/idle time per "
                    "worker, the disk traffic of a memory-limited step (transfers to and from the disk node, bytes, "
                    "evictions; when the traces record it: simulate --memory-limit --offload-dir --out and "
                    "run --memory-limit --offload-dir --trace .parquet files), "
                    "and the kernels and phases that account for most of the difference. Writes a "
                    "report folder (HTML page, Gantt and error PNGs, Chrome traces, summary JSON).")
    p.add_argument("pred", metavar="PRED", help="predicted trace (.parquet or .csv, source 'sim')")
    p.add_argument("real", metavar="REAL", help="measured trace (.parquet or .csv, source 'real')")
    add_out_arg(p, "tilecast-report", "the report (HTML page, Gantt and error PNGs, Chrome traces, summary JSON)")
    p.add_argument("--before", metavar="PRED0",
                   help="an earlier prediction of the same run (e.g. before recalibration), shown beside PRED")
    p.add_argument("--any-source", action="store_true",
                   help="do not require PRED to be simulated and REAL measured (e.g. two measured runs)")
    p.add_argument("--no-chrome", action="store_true",
                   help="do not write the Chrome trace files (large for big graphs)")
    add_json_arg(p)
    return p


def run(args) -> int:
    import tilecast as tc
    from tilecast.reports import ComparisonError

    try:
        c = tc.compare(args.pred, args.real, before=args.before, check_sources=not args.any_source)
    except ComparisonError as e:  # names PRED, REAL or the field before
        raise UsageError(as_flags(str(e))) from None
    try:
        paths = c.write(args.out, chrome=not args.no_chrome)
    except OSError as e:
        raise UsageError(f"--out: cannot write {args.out}: {e.strerror or e}") from None
    s = c.summary
    if args.json:
        print_json({**s, "files": paths})
        return 0
    st, m, e = s["step"], s["makespan"], s["task_duration_error"]
    if st["error"] is not None:
        print(f"step      predicted {st['pred_s'] * 1e3:.3f} ms  measured {st['real_s'] * 1e3:.3f} ms  "
              f"error {st['error'] * 100:+.2f}%")
        print(f"  = makespan {st['pred_makespan_s'] * 1e3:.3f} / {st['real_makespan_s'] * 1e3:.3f} ms "
              f"+ host {st['pred_host_s'] * 1e3:.3f} / {st['real_host_s'] * 1e3:.3f} ms (predicted / measured)")
    else:
        print("step      time not recorded with "
              + " and ".join(w for w, k in (("PRED", "pred_s"), ("REAL", "real_s")) if st[k] is None)
              + " (tilecast simulate --out and run --trace record it in .parquet files): makespan only")
    print(f"makespan  predicted {m['pred_s'] * 1e3:.3f} ms  measured {m['real_s'] * 1e3:.3f} ms  "
          f"error {m['error'] * 100:+.2f}%")
    print(f"  difference {m['diff_s'] * 1e3:+.3f} ms = task time {m['from_task_time_s'] * 1e3:+.3f} ms "
          f"+ idle time {m['from_idle_time_s'] * 1e3:+.3f} ms (per worker, {m['workers']} workers)")
    if "before_after" in s:
        b = s["before_after"]
        step = "" if b["step_error_before"] is None else f"step error {b['step_error_before'] * 100:+.2f}%, "
        print(f"  before recalibration (--before): {step}makespan error {b['makespan_error_before'] * 100:+.2f}%")
    if e["median_error"] is not None:
        print(f"task durations  median error {e['median_error'] * 100:+.2f}%  "
              f"90th pct |error| {e['p90_abs_error'] * 100:.2f}%  ({s['tasks']['matched']} tasks)")
    print()
    print(f"{'kernel':<20}{'tasks':>7}{'pred ms':>11}{'real ms':>11}{'median err':>12}{'p90 |err|':>11}")
    for r in s["by_kernel"]:
        med = "" if r["median_error"] is None else f"{r['median_error'] * 100:+.2f}%"
        p90 = "" if r["p90_abs_error"] is None else f"{r['p90_abs_error'] * 100:.2f}%"
        print(f"{r['kernel']:<20}{r['tasks']:>7}{r['pred_s'] * 1e3:>11.3f}{r['real_s'] * 1e3:>11.3f}{med:>12}{p90:>11}")
    print()
    if s.get("disk"):
        from tilecast.reports.disk_traffic import disk_lines
        print("\n".join(disk_lines(s["disk"])))
        print()
    if s["top_phases"]:
        print("phases accounting for most of the difference:")
        for r in s["top_phases"][:5]:
            print(f"  {r['phase']:<30} {r['diff_s'] * 1e3:+.3f} ms  ({r['share'] * 100:.1f}%)")
    print(f"\nreport: {paths['html']}")
    return 0
