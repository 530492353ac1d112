"""``tilecast whatif --inference``: serving a model (prefill, decode, KV cache) on a cluster."""

from __future__ import annotations

import json

from tilecast.cli import UsageError

# library field -> flag (the weights' dtype is the shared --dtype)
INFERENCE_FLAGS = {"weight_dtype": "--dtype", "kv_dtype": "--kv-dtype", "input_len": "--input-len",
                   "output_len": "--output-len", "request_rate": "--request-rate", "max_batch": "--max-batch",
                   "batch": "--batch", "tp": "--tp", "pp": "--pp", "dp": "--dp", "engine": "--engine",
                   "model": "--model", "cluster": "--cluster", "ep": "--ep", "cp": "--cp",
                   "capacity_factor": "--capacity-factor", "expert_imbalance": "--expert-imbalance"}
TRAINING_ONLY = ("trace",)

JSON_KEYS = """\
--json keys (--inference): model, cluster, engine, config (tp, pp, dp, batch, input_len, output_len, weight_dtype,
kv_dtype, request_rate [requests/s], max_batch, ep, cp, capacity_factor, expert_imbalance), mode ("fixed-batch" | "continuous"), gpus, batch [sequences in
flight per replica], max_batch [largest batch that fits, per replica], tokens_per_s [output tokens/s, all replicas],
tokens_per_s_per_gpu, total_tokens_per_s [input + output tokens/s], ttft_s [s], tpot_s [s], request_latency_s [s],
requests_per_s, overloaded, prefill and decode (time_s [s], compute_s, memory_s, comm_s, overhead_s [s], flops,
hbm_bytes [bytes], tokens, steps), breakdown (compute_s, memory_s, comm_s, overhead_s, pipeline_idle_s, total_s [s]),
memory (weights, kv_cache, workspace, reserved, total [bytes per GPU]), memory_per_gpu_bytes, memory_capacity_bytes,
fits, kv_bytes_per_token [bytes per token per GPU]; null where a figure is unbounded (overloaded TTFT); with --sweep,
sweeps: {param: [rows of the swept value, tokens_per_s, tokens_per_s_per_gpu, ttft_s, tpot_s, batch, max_batch,
compute_s, memory_s, comm_s, overhead_s, pipeline_idle_s, exposed_comm_share [comm_s / the total time],
memory_per_gpu_bytes [bytes], fits, overloaded, note ["" or what it would need when it does not fit]; error on a
value the configuration or hardware cannot take]}; with --search: candidates, fitting, top [results as above],
baseline and gain [best tokens/s / baseline tokens/s] with --baseline, search_sweeps with --sweep.
--sweep with --inference: hardware multipliers (flops, hbm_bw, memory, nvlink_bw, network_bw, network_latency),
hardware values (nvlink_domain [GPUs per NVLink domain], nics_per_node, hbm_gb [GB of HBM per GPU]) or
tp, pp, dp, batch, input_len, output_len, weight_dtype, kv_dtype, request_rate, max_batch."""


def add_arguments(p) -> None:
    """The flags of ``whatif --inference`` (added to the whatif parser)."""
    g = p.add_argument_group("inference (--inference)")
    g.add_argument("--inference", action="store_true",
                   help="predict serving instead of training: prefill and decode of --batch requests of --input-len "
                        "prompt tokens and --output-len generated tokens (or a --request-rate with continuous "
                        "batching); --dtype is the weights' dtype; prints tokens/s, TTFT, TPOT, memory per GPU")
    g.add_argument("--batch", type=int, default=1,
                   help="--inference: requests served together (0 = the largest batch that fits in memory)")
    g.add_argument("--input-len", type=int, default=128, help="--inference: prompt tokens per request")
    g.add_argument("--output-len", type=int, default=128, help="--inference: generated tokens per request")
    g.add_argument("--kv-dtype", default=None, help="--inference: KV-cache dtype bf16 | fp16 | fp8 (default --dtype)")
    g.add_argument("--request-rate", type=float, default=0.0,
                   help="--inference: requests/s arriving (continuous batching); 0 = one fixed batch")
    g.add_argument("--max-batch", type=int, default=0,
                   help="--inference with --request-rate: most sequences in flight (0 = what memory allows)")
    g.add_argument("--engine", default=None,
                   help="--inference: serving-engine profile fitted on published runs (trtllm-0.9, the default: "
                        "TensorRT-LLM v0.9 with its GQA kernel; trtllm-0.6; trtllm-0.5; nemo; argonne-trtllm: TensorRT-LLM 0.11; argonne-vllm: vLLM), see "
                        "tilecast/cluster/inference_engines.yaml")


def _check_flags(args) -> None:
    """The flags --inference does not take, and negative counts, in one line naming the flag."""
    for flag in TRAINING_ONLY:
        if getattr(args, flag):
            raise UsageError(f"--{flag}: not available with --inference")
    for flag in ("batch", "input_len", "output_len", "max_batch"):
        if getattr(args, flag) < 0:
            raise UsageError(f"--{flag.replace('_', '-')}: must not be negative")
    if args.shard_group:
        raise UsageError("--shard-group: not available with --inference (no optimizer states to shard)")
    if args.cp < 1:
        raise UsageError(f"--cp: must be a whole number >= 1, got {args.cp}")


def _gb(x):
    return f"{x / 1e9:.1f}"


def _ms(x):
    return "unbounded" if x is None else f"{1e3 * x:.2f} ms"


def _print(r: dict, engine: str) -> None:
    c = r["config"]
    mode = (f"{c['request_rate']:g} requests/s, continuous batching" if r["mode"] == "continuous"
            else f"batch {r['batch']:.0f}")
    extra = "".join(f" {k}={c[k]}" for k in ("cp", "ep") if c.get(k, 1) != 1)
    print(f"{r['model']} served on {r['gpus']} x {r['cluster']} ({engine}): "
          f"tp={c['tp']} pp={c['pp']} dp={c['dp']}{extra} "
          f"{mode}, input {c['input_len']} / output {c['output_len']} tokens, weights {c['weight_dtype']}, "
          f"KV cache {c['kv_dtype']}")
    print(f"  {r['tokens_per_s']:,.0f} output tokens/s ({r['tokens_per_s_per_gpu']:,.0f} per GPU, "
          f"{r['total_tokens_per_s']:,.0f} with the prompts)   TTFT {_ms(r['ttft_s'])}   TPOT {_ms(r['tpot_s'])}   "
          f"request {_ms(r['request_latency_s'])}")
    if r["mode"] == "continuous":
        state = "OVERLOADED: the queue grows; figures of the saturated server" if r["overloaded"] else "steady"
        print(f"  {r['batch']:.1f} sequences in flight on average (at most {r['max_batch']}), {state}")
    b = r["breakdown"]
    tot = b["total_s"] or 1.0

    def part(k, label):
        return f"{label} {b[k]:.4g} s ({100 * b[k] / tot:.1f}%)"

    print("  breakdown: " + "   ".join([part("compute_s", "compute-bound"), part("memory_s", "memory-bound"),
                                        part("comm_s", "tensor-parallel comm" if c.get("ep", 1) == 1 and c.get("cp", 1) == 1
                                             else "comm (tensor-parallel, expert all-to-all, context ring)"),
                                        part("overhead_s", "engine overhead"),
                                        part("pipeline_idle_s", "pipeline idle")]))
    m = r["memory"]
    verdict = "fits" if r["fits"] else "DOES NOT FIT"
    print(f"  memory per GPU: {_gb(m['total'])} GB of {_gb(r['memory_capacity_bytes'])} GB ({verdict}): weights "
          f"{_gb(m['weights'])}, KV cache {_gb(m['kv_cache'])} ({r['kv_bytes_per_token'] / 1e3:.1f} kB per token), "
          f"workspace {_gb(m['workspace'])}, reserved {_gb(m['reserved'])}; largest batch that fits: {r['max_batch']}")


def run_inference(args, cluster, shape) -> int:
    """Exit 0, or 1 when the configuration does not fit in memory or the server is overloaded."""
    import tilecast as tc
    from tilecast.cli.common import library_errors
    from tilecast.cli.sweep_args import sweep_pairs

    _check_flags(args)
    serving = dict(tp=args.tp, pp=args.pp, dp=args.dp, batch=args.batch, input_len=args.input_len,
                   output_len=args.output_len, dtype=args.dtype, kv_dtype=args.kv_dtype,
                   request_rate=args.request_rate, max_batch=args.max_batch, engine=args.engine, ep=args.ep,
                   cp=args.cp, capacity_factor=args.capacity_factor, expert_imbalance=args.expert_imbalance)
    if args.search:
        from tilecast.cli.whatif_inference_search import run_inference_search

        return run_inference_search(args, shape, cluster, serving)
    with library_errors(INFERENCE_FLAGS):
        out = tc.whatif_inference(shape, cluster, gpus=args.gpus, sweeps=sweep_pairs(args.sweep), **serving)
    res, engine = out.result, out.engine
    if args.baseline is not None:
        raise UsageError("--baseline: only with --search")
    if args.plot and not args.sweep:
        raise UsageError("--plot: needs --sweep")
    sweeps = list(out.sweeps.items())
    if args.plot:
        from tilecast.cluster.inference_sweep import INFERENCE_PARTS
        from tilecast.cluster.sweep import plot_sweeps

        plot_sweeps(sweeps, args.plot, parts=INFERENCE_PARTS, unit="seconds (the batch's prefill and decode)")
    obj = {"engine": engine, **res.to_dict()}
    if args.json:
        if sweeps:
            obj["sweeps"] = {p: json.loads(df.to_json(orient="records")) for p, df in sweeps}
        print(json.dumps(obj))
    else:
        _print(obj, engine)
        import pandas as pd

        for param, df in sweeps:
            print(f"\nsweep of {param}:")
            with pd.option_context("display.width", 220, "display.max_columns", 30, "display.float_format",
                                   "{:.4g}".format):
                print(df.to_string(index=False))
    return 0 if res.fits and not res.overloaded else 1
