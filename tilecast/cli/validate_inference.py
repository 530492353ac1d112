"""The inference part of ``tilecast validate``: published serving figures against ``whatif --inference``."""

from __future__ import annotations

import json

from tilecast.cli import UsageError


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
    from tilecast.cluster.inference_validation import (INFERENCE_RUNS, InferenceTableError, compare_inference,
                                                       load_inference_runs, median_abs_error)

    path = args.inference_table or INFERENCE_RUNS
    try:
        runs = load_inference_runs(path)
    except FileNotFoundError:
        raise UsageError(f"--inference-table: no such file {path}") from None
    except (InferenceTableError, ValueError, TypeError) as e:
        raise UsageError(f"--inference-table: {e}") from None
    if args.role != "all":
        runs = [r for r in runs if r.role == args.role]
    if not runs:
        return {"runs": []}, [], True
    try:
        df = compare_inference(runs)
    except ValueError as e:
        raise UsageError(f"--inference-table: {e}") from None
    val = df[df.role == "validation"]
    med_val = median_abs_error(val)
    worst = float(val.error.abs().max()) if len(val) else float("nan")
    ok = not len(val) or (med_val <= args.inference_target and worst <= args.inference_max_error)
    beyond_ids = sorted(val[val.error.abs() > args.inference_max_error].id) if len(val) else []
    obj = {"runs": json.loads(df.to_json(orient="records")), "median_abs_error": median_abs_error(df),
           # null, not NaN (which is not JSON), when no validation row was predicted
           "median_abs_error_validation_rows": med_val if len(val) else None,
           "max_abs_error_validation_rows": worst if len(val) else None,
           "target": args.inference_target, "max_error": args.inference_max_error, "ok": bool(ok),
           "rows_beyond_max_error": beyond_ids,
           "sources": sorted(set(df.source))}
    lines = ["", "inference (tilecast whatif --inference; error = predicted / published - 1):",
             (f"{'run':<40} {'source':<15} {'role':<11} {'cluster':<8} {'tp':>2} {'metric':<20} {'published':>10} "
             f"{'predicted':>10} {'error':>7}")]
    for r in df.itertuples():
        lines.append(f"{r.id:<40} {r.source:<15} {r.role:<11} {r.cluster:<8} {r.tp:>2} {r.metric:<20} "
                     f"{r.published:>10.4g} {r.predicted:>10.4g} {100 * r.error:>+6.1f}%")
    beyond = val[val.error.abs() > args.inference_max_error]
    med_ok = not len(val) or med_val <= args.inference_target
    if not len(val):
        lines.append(f"\ninference: {len(df)} rows, median |error| {100 * median_abs_error(df):.1f}%; no validation "
                     "row among them, so no verdict on the targets")
    else:
        lines.append(f"\ninference: median |error| {100 * med_val:.1f}% over the {len(val)} validation rows (all "
                     f"{len(df)} rows: {100 * median_abs_error(df):.1f}%) from {df.source.nunique()} sources; target "
                     f"{100 * args.inference_target:.0f}%: {'met' if med_ok else 'NOT met'}; largest "
                     f"{100 * worst:.1f}%, {len(beyond)} rows beyond {100 * args.inference_max_error:.0f}%"
                     + (f" ({', '.join(beyond.id)})" if len(beyond) else ""))
    lines.append("sources and calibration: tilecast/cluster/validation/inference.yaml and README.md")
    return obj, lines, ok
