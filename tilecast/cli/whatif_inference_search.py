"""``tilecast whatif --inference --search``: the serving layouts (TP x PP x DP on --gpus) with the highest output
tokens/s, their gain over a ``--baseline`` configuration, and with ``--sweep`` of a hardware parameter the best
layout at each hardware point."""

from __future__ import annotations

import json

from tilecast.cli import UsageError

BASELINE_FIELDS = {"tp": int, "pp": int, "dp": int, "batch": int, "weight_dtype": str, "kv_dtype": str, "ep": int}


def _share(r) -> float:
    b = r.breakdown
    return b["comm_s"] / b["total_s"] if b["total_s"] else 0.0


def _label(r) -> str:
    from tilecast.cluster.inference_search import layout_label

    return layout_label(r)


def run_inference_search(args, shape, cluster, serving: dict) -> int:
    import tilecast as tc
    from tilecast.cli.common import library_errors
    from tilecast.cli.sweep_args import layout_fields, sweep_pairs
    from tilecast.cli.whatif_inference import INFERENCE_FLAGS

    if not args.gpus:
        raise UsageError("--search: needs --gpus")
    if args.plot:
        raise UsageError("--plot: not available with --search (plot a --sweep of one configuration)")
    fields = None if args.baseline is None else layout_fields(args.baseline, BASELINE_FIELDS)
    with library_errors(INFERENCE_FLAGS):
        found = tc.whatif_inference_search(shape, cluster, args.gpus, top=args.top, baseline=fields,
                                           sweeps=sweep_pairs(args.sweep), **serving)
    res = {"candidates": found.candidates, "fitting": found.fitting, "top": found.top, "baseline": found.baseline,
           "gain": found.gain}
    base, cfg, engine, sweeps = found.baseline, found.template, found.engine, list(found.sweeps.items())
    if args.json:
        obj = {"engine": engine, "candidates": res["candidates"], "fitting": res["fitting"],
               "top": [r.to_dict() for r in res["top"]]}
        if base is not None:
            obj["baseline"] = res["baseline"].to_dict()
            obj["gain"] = res["gain"]
        if sweeps:
            obj["search_sweeps"] = {p: json.loads(df.to_json(orient="records")) for p, df in sweeps}
        print(json.dumps(obj))
        return 0 if res["top"] else 1
    batch = f"batch {cfg.batch} per replica" if cfg.batch else "the largest batch that fits each layout"
    print(f"{shape.name} served on {args.gpus} x {cluster.name} ({engine}), input {cfg.input_len} / output "
          f"{cfg.output_len} tokens, {batch}, weights {cfg.weight_dtype}, KV cache {cfg.kv_dtype}: "
          f"{res['candidates']} layouts, {res['fitting']} fit in memory")
    moe = shape.is_moe  # an EP column for mixtures of experts (EP of the TP GPUs hold different experts)
    print(f"{'#':>3} {'tp':>3} {'pp':>3} {'dp':>4}{' ep' if moe else ''} {'batch':>6} {'tokens/s':>12} {'per GPU':>9} {'TTFT ms':>9} "
          f"{'TPOT ms':>8} {'comm %':>7} {'mem GB':>7}")
    for i, r in enumerate(res["top"], 1):
        c = r.config
        ep_col = f" {c['ep']:>2}" if moe else ""
        print(f"{i:>3} {c['tp']:>3} {c['pp']:>3} {c['dp']:>4}{ep_col} {r.batch:>6.0f} {r.tokens_per_s:>12,.0f} "
              f"{r.tokens_per_s_per_gpu:>9,.0f} {1e3 * r.ttft_s:>9.1f} {1e3 * r.tpot_s:>8.2f} "
              f"{100 * _share(r):>7.1f} {r.memory_per_gpu_bytes / 1e9:>7.1f}")
    if not res["top"]:
        print("no layout fits in memory")
    if base is not None:
        b = res["baseline"]
        print(f"baseline {_label(b)}: {b.tokens_per_s:,.0f} output tokens/s, tensor-parallel communication "
              f"{100 * _share(b):.1f}% of the time" + ("" if b.fits else " (DOES NOT FIT)"))
        if res["gain"] is not None:
            t = res["top"][0]
            print(f"best layout {_label(t)}: {res['gain']:.2f}x the baseline's output tokens/s (same GPUs, "
                  f"requests and hardware)")
    import pandas as pd

    for param, df in sweeps:
        print(f"\nbest serving layout at each {param}:")
        with pd.option_context("display.width", 220, "display.max_columns", 30, "display.float_format",
                               "{:.4g}".format):
            print(df.to_string(index=False))
    return 0 if res["top"] else 1
