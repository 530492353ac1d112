"""``tilecast validate``: predictions against published measurements of large training runs."""

from __future__ import annotations

import json



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
    from tilecast.cli.validate_inference import add_arguments

    add_arguments(p)
    return p


FLAGS = {"table": "--table", "refit_lopo": "--refit-lopo"}


def run(args):
    import tilecast as tc
    from tilecast.cli.common import library_errors

    with library_errors(FLAGS):
        res = tc.validate(args.table, args.target, args.lopo_target, args.max_error, args.refit_lopo)
    card, df, ok = res.scorecard, res.runs, res.ok
    lopo = "lopo_error" in df.columns
    shown = df if args.role == "all" else df[df.role == args.role]
    from tilecast.cli.validate_inference import inference_report

    inf_obj, inf_lines, _ = inference_report(args)  # reported beside; the exit status stays training's
    if args.json:
        print(json.dumps({"runs": json.loads(shown.to_json(orient="records")), **card, "inference": inf_obj}))
        return 0 if ok else 1
    print(f"{'run':<28} {'source':<7} {'role':<11} {'GPUs':>5} {'metric':<13} {'published':>12} {'predicted':>12} "
          f"{'error':>7}" + (f" {'LOPO':>7}" if lopo else ""))
    for r in shown.itertuples():
        print(f"{r.id:<28} {r.source:<7} {r.role:<11} {r.gpus:>5} {r.metric:<13} {r.published:>12.4g} "
              f"{r.predicted:>12.4g} {100 * r.error:>+6.1f}%" + (f" {100 * r.lopo_error:>+6.1f}%" if lopo else ""))
    print(f"\nheld-out rows (never fitted): median |error| {100 * card['median_abs_error_heldout']:.1f}% over "
          f"{card['heldout_rows']} runs, worst {card['worst_heldout']} {100 * card['max_abs_error_heldout']:.1f}%, "
          f"{card['heldout_beyond_25pct']} beyond 25%; target {100 * args.target:.0f}%")
    print(f"fitted rows (calibration, not counted): median |error| {100 * card['median_abs_error_fitted']:.1f}% "
          f"over {card['fitted_rows']} runs")
    if lopo:
        by = ", ".join(f"{s} {100 * v:.1f}%" for s, v in card["median_abs_error_lopo_by_source"].items())
        print(f"leave-one-publication-out (each publication predicted by a fit on the others only): median "
              f"|error| {100 * card['median_abs_error_lopo']:.1f}% over {len(df)} runs ({by})"
              + (f"; target {100 * args.lopo_target:.0f}%" if args.lopo_target else ""))
    else:
        print("leave-one-publication-out: no stored folds for this table (--refit-lopo fits them)")
    print(f"{'met' if ok else 'NOT met'}; sources and what was fitted: tilecast/cluster/validation/README.md")
    print("\n".join(inf_lines))
    return 0 if ok else 1
