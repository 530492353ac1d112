"""The inference part of ``tilecast validate``: published serving figures against ``whatif --inference``."""

from __future__ import annotations


def add_arguments(p) -> None:
    p.add_argument("--inference-table", default=None,
                   help="an inference validation table (YAML) instead of the shipped one")
    p.add_argument("--inference-target", type=float, default=0.15,
                   help="inference: largest acceptable median |error| over the validation rows (default 0.15); "
                        "the inference verdict is printed, the exit status is the training table's")
    p.add_argument("--inference-max-error", type=float, default=0.35,
                   help="inference: largest acceptable |error| of any validation row (default 0.35)")


def inference_report(args) -> tuple:
    """(JSON object, lines for people, whether the targets are met); the targets count validation rows only."""
    import tilecast as tc
    from tilecast.cli.common import library_errors

    flags = {"table": "--inference-table", "target": "--inference-target", "max_error": "--inference-max-error"}
    with library_errors(flags):
        res = tc.validate_inference(args.inference_table, args.role, args.inference_target,
                                    args.inference_max_error)
    df, obj = res.runs, res.summary
    if not len(df):
        return obj, [], True
    val = df[df.role == "validation"]
    lines = ["", "inference (tilecast whatif --inference; error = predicted / published - 1):",
             (f"{'run':<40} {'source':<15} {'role':<11} {'cluster':<8} {'tp':>2} {'metric':<20} {'published':>10} "
             f"{'predicted':>10} {'error':>7}")]
    for r in df.itertuples():
        lines.append(f"{r.id:<40} {r.source:<15} {r.role:<11} {r.cluster:<8} {r.tp:>2} {r.metric:<20} "
                     f"{r.published:>10.4g} {r.predicted:>10.4g} {100 * r.error:>+6.1f}%")
    if not len(val):
        lines.append(f"\ninference: {len(df)} rows, median |error| {100 * res.median_abs_error:.1f}%; no validation "
                     "row among them, so no verdict on the targets")
    else:
        med_val, beyond = res.median_abs_error_validation_rows, list(val[val.error.abs() > res.max_error].id)
        lines.append(f"\ninference: median |error| {100 * med_val:.1f}% over the {len(val)} validation rows (all "
                     f"{len(df)} rows: {100 * res.median_abs_error:.1f}%) from {df.source.nunique()} sources; target "
                     f"{100 * res.target:.0f}%: {'met' if med_val <= res.target else 'NOT met'}; largest "
                     f"{100 * res.max_abs_error_validation_rows:.1f}%, {len(beyond)} rows beyond "
                     f"{100 * res.max_error:.0f}%" + (f" ({', '.join(beyond)})" if beyond else ""))
    lines.append("sources and calibration: tilecast/cluster/validation/inference.yaml and README.md")
    return obj, lines, res.ok
