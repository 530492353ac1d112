"""``tilecast validate``: predictions against published measurements of large training runs."""

from __future__ import annotations

import json

from tilecast.cli import UsageError


def add_parser(sub):
    p = sub.add_parser("validate", help="compare what-if predictions with published training throughput",
                       description="Predict every run of the shipped validation table (published measurements of "
                                   "real large-scale training runs) and print predicted vs published, the error of "
                                   "each and their median. Exit 1 if the median error exceeds --target.")
    p.add_argument("--table", default=None, help="a validation table (YAML) instead of the shipped one")
    p.add_argument("--role", choices=["all", "validation", "calibration"], default="all",
                   help="rows to compare (calibration rows were used to fit the efficiency curves)")
    p.add_argument("--target", type=float, default=0.10, help="largest acceptable median |error| (default 0.10)")
    p.add_argument("--json", action="store_true", help="one JSON object on standard output")
    from tilecast.cli.validate_inference import add_arguments

    add_arguments(p)
    return p


def run(args):
    from tilecast.cluster.validation import RUNS, ValidationTableError, compare, load_runs, median_abs_error

    path = args.table or RUNS
    try:
        runs = load_runs(path)
    except FileNotFoundError:
        raise UsageError(f"--table: no such file {path}") from None
    except (ValidationTableError, ValueError, TypeError) as e:
        raise UsageError(f"--table: {e}") from None
    if args.role != "all":
        runs = [r for r in runs if r.role == args.role]
    if not runs:
        raise UsageError(f"--role: no {args.role} rows in {path}")
    df = compare(runs)
    med = median_abs_error(df)
    med_val = median_abs_error(df[df.role == "validation"])
    ok = med <= args.target
    from tilecast.cli.validate_inference import inference_report

    inf_obj, inf_lines, _ = inference_report(args)  # reported beside; the exit status stays training's
    if args.json:
        print(json.dumps({"runs": json.loads(df.to_json(orient="records")), "median_abs_error": med,
                          "median_abs_error_validation_rows": med_val, "target": args.target, "ok": ok,
                          "sources": sorted(set(df.source)), "inference": inf_obj}))
        return 0 if ok else 1
    print(f"{'run':<28} {'source':<7} {'role':<11} {'GPUs':>5} {'metric':<13} {'published':>12} {'predicted':>12} {'error':>7}")
    for r in df.itertuples():
        print(f"{r.id:<28} {r.source:<7} {r.role:<11} {r.gpus:>5} {r.metric:<13} {r.published:>12.4g} "
              f"{r.predicted:>12.4g} {100 * r.error:>+6.1f}%")
    print(f"\nmedian |error|: {100 * med:.1f}% over {len(df)} runs from {df.source.nunique()} publications "
          f"(validation rows only: {100 * med_val:.1f}%); target {100 * args.target:.0f}%: {'met' if ok else 'NOT met'}")
    print("sources and calibration: tilecast/cluster/validation/runs.yaml and README.md")
    print("\n".join(inf_lines))
    return 0 if ok else 1
