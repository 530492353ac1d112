"""``tilecast validate``: predictions against published measurements of large training runs."""

from __future__ import annotations

import json

from tilecast.cli import UsageError


def add_parser(sub):
    p = sub.add_parser("validate", help="compare what-if predictions with published training throughput",
                       description="Predict every run of the shipped validation table (published measurements of "
                                   "real large-scale training runs) and print predicted vs published, the error "
                                   "of each and its leave-one-publication-out error (the row predicted by a fit on "
                                   "the other publications only). Pass or fail is decided on the held-out rows only "
                                   "(role validation: never used for fitting): exit 1 if their median |error| "
                                   "exceeds --target, or, when given, if the leave-one-publication-out median "
                                   "exceeds --lopo-target or a held-out row exceeds --max-error.")
    p.add_argument("--table", default=None, help="a validation table (YAML) instead of the shipped one")
    p.add_argument("--role", choices=["all", "validation", "calibration"], default="all",
                   help="rows printed (calibration rows were used to fit the efficiency curves)")
    p.add_argument("--target", type=float, default=0.08,
                   help="largest acceptable median |error| over held-out rows (default 0.08)")
    p.add_argument("--lopo-target", type=float, default=None,
                   help="also fail if the leave-one-publication-out median |error| exceeds this (default: "
                        "reported, not checked)")
    p.add_argument("--max-error", type=float, default=None,
                   help="also fail if a held-out row's |error| exceeds this (default: reported, not checked)")
    p.add_argument("--refit-lopo", action="store_true",
                   help="fit the leave-one-publication-out folds now (minutes) instead of reading the stored "
                        "ones; needed for a --table other than the shipped one")
    p.add_argument("--json", action="store_true",
                   help="one JSON object on standard output (errors are fractions: predicted / published - 1)")
    return p


def _lopo(runs, args, shipped):
    from tilecast.cluster.lopo import StaleFoldsError, lopo_errors

    if not (shipped or args.refit_lopo):
        return None, "leave-one-publication-out: no stored folds for this table (--refit-lopo fits them)"
    try:
        return lopo_errors(runs, "refit" if args.refit_lopo else None), None
    except StaleFoldsError as e:
        raise UsageError(f"--refit-lopo: {e}") from None
    except OSError as e:
        raise UsageError(f"--refit-lopo: no stored leave-one-publication-out folds ({e.strerror}: "
                         f"{e.filename}); python3 -m tilecast.cluster.calibrate --lopo writes them") from None


def run(args):
    from tilecast.cluster.validation import RUNS, ValidationTableError, compare, load_runs, scorecard

    path = args.table or RUNS
    for flag in ("target", "lopo_target", "max_error"):
        v = getattr(args, flag)
        if v is not None and not v > 0:
            raise UsageError(f"--{flag.replace('_', '-')}: must be positive, got {v}")
    try:
        runs = load_runs(path)
    except FileNotFoundError:
        raise UsageError(f"--table: no such file {path}") from None
    except (ValidationTableError, ValueError, TypeError) as e:
        raise UsageError(f"--table: {e}") from None
    if not runs:
        raise UsageError(f"--table: no rows in {path}")
    df = compare(runs)
    lopo, note = _lopo(runs, args, args.table is None)
    try:
        card = scorecard(df, lopo, args.target, args.lopo_target, args.max_error)
    except ValidationTableError as e:
        raise UsageError(f"--table: {e}") from None
    ok = card["ok"]
    if lopo is not None:
        df = df.merge(lopo[["id", "error"]].rename(columns={"error": "lopo_error"}), on="id")
    shown = df if args.role == "all" else df[df.role == args.role]
    if args.json:
        print(json.dumps({"runs": json.loads(shown.to_json(orient="records")), **card}))
        return 0 if ok else 1
    lcol = lopo is not None
    print(f"{'run':<28} {'source':<7} {'role':<11} {'GPUs':>5} {'metric':<13} {'published':>12} {'predicted':>12} "
          f"{'error':>7}" + (f" {'LOPO':>7}" if lcol else ""))
    for r in shown.itertuples():
        print(f"{r.id:<28} {r.source:<7} {r.role:<11} {r.gpus:>5} {r.metric:<13} {r.published:>12.4g} "
              f"{r.predicted:>12.4g} {100 * r.error:>+6.1f}%" + (f" {100 * r.lopo_error:>+6.1f}%" if lcol else ""))
    print(f"\nheld-out rows (never fitted): median |error| {100 * card['median_abs_error_heldout']:.1f}% over "
          f"{card['heldout_rows']} runs, worst {card['worst_heldout']} {100 * card['max_abs_error_heldout']:.1f}%, "
          f"{card['heldout_beyond_25pct']} beyond 25%; target {100 * args.target:.0f}%")
    print(f"fitted rows (calibration, not counted): median |error| {100 * card['median_abs_error_fitted']:.1f}% "
          f"over {card['fitted_rows']} runs")
    if lopo is not None:
        by = ", ".join(f"{s} {100 * v:.1f}%" for s, v in card["median_abs_error_lopo_by_source"].items())
        print(f"leave-one-publication-out (each publication predicted by a fit on the others only): median "
              f"|error| {100 * card['median_abs_error_lopo']:.1f}% over {len(lopo)} runs ({by})"
              + (f"; target {100 * args.lopo_target:.0f}%" if args.lopo_target else ""))
    else:
        print(note)
    print(f"{'met' if ok else 'NOT met'}; sources and what was fitted: tilecast/cluster/validation/README.md")
    return 0 if ok else 1
