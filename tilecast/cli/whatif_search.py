"""``tilecast whatif --search``: the fastest layouts that fit, their gain over a ``--baseline`` layout, and
with ``--sweep`` of a hardware parameter the best layout at each hardware point."""

from __future__ import annotations

import json

from tilecast.cli import UsageError


def baseline_strategy(args, shape, cluster, gb: int):
    """The ``--baseline`` layout: the layout flags (--tp, --pp, --dp, --micro-batch, ...) with the fields of
    the ``--baseline`` value replaced (``ep=8``, ``cp=2`` among them); dp = gpus / (tp cp pp) unless given.
    None without ``--baseline``."""
    from tilecast.cli.sweep_args import layout_fields
    from tilecast.cluster.search import baseline_layout
    from tilecast.cluster.strategy import Strategy, StrategyError
    from tilecast.cluster.sweep import STRATEGY

    if args.baseline is None:
        return None
    fields = {"tp": args.tp or 1, "pp": args.pp or 1, **({"dp": args.dp} if args.dp else {})}
    fields.update(layout_fields(args.baseline, {k: v for k, v in STRATEGY.items() if k not in ("global_batch", "seq")}))
    try:
        template = Strategy(seq=args.seq, global_batch=gb, micro_batch=args.micro_batch, zero=args.zero,
                            schedule=args.schedule, recompute=args.recompute, sequence_parallel=args.sequence_parallel,
                            dtype=args.dtype, attention=args.attention, collective_algo=args.collective_algo,
                            tp_comm_overlap=args.tp_comm_overlap, overlap_param_gather=args.overlap_param_gather,
                            overlap_grad_reduce=not args.no_overlap_grad_reduce,
                            grad_reduce_bytes=4 if args.grad_dtype == "fp32" else 2,
                            ep=args.ep, cp=args.cp, capacity_factor=args.capacity_factor,
                            expert_imbalance=args.expert_imbalance, shard_group=args.shard_group,
                            virtual_stages=args.virtual_stages or (2 if args.schedule == "interleaved" else 1))
        st = baseline_layout(template, fields, args.gpus)
        if "virtual_stages" not in fields and st.schedule == "interleaved" and not args.virtual_stages:
            st = st.with_(virtual_stages=2)
        return st.check(shape, cluster)
    except (StrategyError, TypeError) as e:
        raise UsageError(f"--baseline: {e}") from None


def _share(r) -> float:
    return r.breakdown["exposed_comm_s"] / r.step_s


def run_search(args, shape, cluster) -> int:
    import tilecast as tc
    from tilecast.cli.common import library_errors
    from tilecast.cli.sweep_args import sweep_pairs
    from tilecast.cluster.search import layout_label

    if not args.gpus:
        raise UsageError("--search: needs --gpus")
    if args.plot:
        raise UsageError("--plot: not available with --search (plot a --sweep of one layout)")
    gb = args.global_batch or args.gpus
    # the recipe every candidate shares; EP is searched (mixtures of experts), --ep only sets the baseline's
    kw = dict(dtype=args.dtype, attention=args.attention, capacity_factor=args.capacity_factor,
              expert_imbalance=args.expert_imbalance, grad_reduce_bytes=4 if args.grad_dtype == "fp32" else 2)
    base = baseline_strategy(args, shape, cluster, gb)
    with library_errors():
        found = tc.whatif_search(shape, cluster, args.gpus, args.seq, gb, top=args.top, max_configs=args.max_configs,
                                 baseline=base, progress=not args.json, sweeps=sweep_pairs(args.sweep), **kw)
    res = {"candidates": found.candidates, "fitting": found.fitting, "evaluated": found.evaluated,
           "top": found.top, "baseline": found.baseline, "gain": found.gain}
    sweeps = list(found.sweeps.items())
    if args.json:
        obj = {"candidates": res["candidates"], "fitting": res["fitting"], "evaluated": res["evaluated"],
               "top": [r.to_dict() for r in res["top"]]}
        if base is not None:
            obj["baseline"] = res["baseline"].to_dict()
            obj["gain"] = res["gain"]
        if sweeps:
            obj["search_sweeps"] = {p: json.loads(df.to_json(orient="records")) for p, df in sweeps}
        print(json.dumps(obj))
        return 0 if res["top"] else 1
    print(f"{shape.name} on {args.gpus} x {cluster.name}, seq {args.seq}, global batch {gb}: "
          f"{res['candidates']} layouts, {res['fitting']} fit in memory, {res['evaluated']} simulated")
    ep = shape.is_moe  # an EP column for mixtures of experts
    print(f"{'#':>3} {'tp':>3} {'pp':>3} {'dp':>5}{' ep' if ep else ''} {'mb':>3} {'zero':>4} {'schedule':>12} {'recompute':>9} "
          f"{'step s':>9} {'tokens/s':>12} {'TFLOP/s':>8} {'MFU %':>6} {'exposed':>8} {'bubble':>7} {'mem GB':>7}")
    for i, r in enumerate(res["top"], 1):
        s = r.strategy
        sched = s["schedule"] + (f"/{s['virtual_stages']}" if s["schedule"] == "interleaved" else "")
        ep_col = f" {s['ep']:>2}" if ep else ""
        print(f"{i:>3} {s['tp']:>3} {s['pp']:>3} {s['dp']:>5}{ep_col} {s['micro_batch']:>3} {s['zero']:>4} {sched:>12} "
              f"{s['recompute']:>9} {r.step_s:>9.3f} {r.tokens_per_s:>12,.0f} {r.tflops_per_gpu:>8.1f} "
              f"{100 * r.mfu:>6.1f} {r.breakdown['exposed_comm_s']:>8.3f} {r.breakdown['bubble_s']:>7.3f} "
              f"{r.memory_per_gpu_bytes / 1e9:>7.1f}")
    if not res["top"]:
        print("no layout fits in memory")
    if base is not None:
        b = res["baseline"]
        print(f"baseline {layout_label(b.strategy)}: {b.tokens_per_s:,.0f} tokens/s, MFU {100 * b.mfu:.1f}%, exposed "
              f"communication {100 * _share(b):.1f}% of the step"
              + ("" if b.fits else f" (DOES NOT FIT: needs {b.memory_per_gpu_bytes / 1e9:.1f} GB per GPU)"))
        if res["gain"] is not None:
            t = res["top"][0]
            print(f"best layout {layout_label(t.strategy)}: {res['gain']:.2f}x the baseline's tokens/s (exposed "
                  f"communication {100 * _share(t):.1f}% of the step; same GPUs, sequence, global batch, hardware)")
    import pandas as pd

    for param, df in sweeps:
        print(f"\nbest layout at each {param}" + (" (gain: over the baseline on the same hardware; "
                                                 "gain_vs_base_hardware: over the baseline on the unchanged cluster)"
                                                 if base is not None else "") + ":")
        with pd.option_context("display.width", 220, "display.max_columns", 30, "display.max_colwidth", 60,
                               "display.float_format", "{:.4g}".format):
            print(df.to_string(index=False))
    return 0 if res["top"] else 1
