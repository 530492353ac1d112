"""``tilecast whatif``: one distributed-training configuration, a sweep, or a layout search."""

from __future__ import annotations

import json
import sys

from tilecast.cli import UsageError


def add_parser(sub):
    p = sub.add_parser("whatif", help="predict a distributed training step (parallelism, collectives, memory)",
                       description="Predict the step time, its breakdown, throughput, MFU and memory per GPU of "
                                   "one distributed training configuration (dense or mixture-of-experts, with "
                                   "tensor, pipeline, data, expert and context parallelism); sweep a hardware or strategy "
                                   "parameter; or search the best layout.")
    p.add_argument("--cluster", default="dgx-a100", help="shipped cluster (dgx-a100, dgx-h100, dgx-h200) or YAML file")
    p.add_argument("--gpus", type=int, default=0, help="GPUs used (default tp x pp x dp); with --tp/--pp, dp = gpus/(tp pp)")
    p.add_argument("--model", default="gpt3-175b",
                   help="a preset (gpt3-175b, mt-nlg-530b, bloom-176b, mpt-7b, llama3-70b, mixtral-8x7b, "
                        "deepseek-moe-16b, gpt2, ...: tilecast/graph/presets.py), a transformers config.json "
                        "(gpt2, llama, mixtral) or JSON with ModelConfig's fields")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--global-batch", type=int, default=0, help="sequences per step (default dp x micro-batch x 2pp)")
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--dp", type=int, default=0, help="data-parallel degree (default from --gpus)")
    p.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3], help="ZeRO stage (3 = FSDP)")
    p.add_argument("--schedule", default="1f1b", help="gpipe | 1f1b | interleaved")
    p.add_argument("--pipeline-split", default="even", choices=["even", "head"],
                   help="layers per pipeline stage: even (n_layer / pp), or head: balanced with the LM head's "
                        "work on the last stage (uneven; e.g. llama3-405b on --pp 16: 7, 8 x 14, 7)")
    p.add_argument("--stage-layers", default="", metavar="N,N,...",
                   help="explicit layers per pipeline stage (--pp numbers summing to the model's layers)")
    p.add_argument("--virtual-stages", type=int, default=0, help="model chunks per pipeline rank (interleaved; default 2)")
    p.add_argument("--recompute", default="none", help="none | selective | full")
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--dtype", default="bf16", help="bf16 | fp16 | fp8 | tf32 | fp32")
    p.add_argument("--attention", default="flash", help="flash (FlashAttention-style kernel) | cudnn (cuDNN fused attention) | unfused (scores in HBM)")
    p.add_argument("--collective-algo", default="auto", help="auto | ring | tree | hierarchical")
    p.add_argument("--tp-comm-overlap", action="store_true", help="overlap tensor-parallel collectives with GEMMs")
    p.add_argument("--overlap-param-gather", action="store_true",
                   help="ZeRO-1/2: gather updated parameters during the next forward")
    p.add_argument("--no-overlap-grad-reduce", action="store_true", help="reduce gradients after the pipeline flush")
    p.add_argument("--grad-dtype", default="bf16", choices=["bf16", "fp16", "fp32"],
                   help="dtype gradients are kept and reduced in (fp32: Megatron-LM's default for bf16 models, "
                        "18 bytes/param of model states with DDP instead of 16)")
    p.add_argument("--sweep", action="append", default=[], metavar="PARAM=VALUES",
                   help="vary one parameter, e.g. network_bw=x0.5..x4, flops=1,2, tp=1,2,4,8, schedule=1f1b,interleaved, "
                        "ep=1,2,4,8 (experts; dp stays, so EP must divide it), cp=1,2,4, expert_imbalance=1,1.5; "
                        "hardware as MAD Max sweeps it: nvlink_domain=8..64 (GPUs per NVLink domain), "
                        "nics_per_node=2,4,8, hbm_gb=40,80,141, hbm_bw=x0.5..x2, flops=x1..x4 (rows add "
                        "exposed_comm_share and a note when the layout no longer fits); with --search, hardware "
                        "parameters only: the best layout at each point")
    p.add_argument("--plot", metavar="FILE.png", help="with --sweep: plot tokens/s, the exposed-communication share "
                                                      "and the breakdown")
    p.add_argument("--trace", metavar="FILE", help="write the simulated timeline (.parquet, .csv, or .json Chrome "
                                                   "trace: one process per pipeline stage, one thread per stream)")
    p.add_argument("--search", action="store_true",
                   help="search the fastest layout that fits for --gpus (TP, PP, DP, micro-batch, ZeRO, schedule, "
                        "recomputation; for a mixture of experts also EP over the divisors of the expert count "
                        "that divide DP, with --capacity-factor / --expert-imbalance applied to every layout)")
    p.add_argument("--top", type=int, default=10, help="with --search: configurations printed")
    p.add_argument("--max-configs", type=int, default=1000, help="with --search: evaluate at most this many layouts")
    p.add_argument("--baseline", nargs="?", const="", default=None, metavar="FIELD=VALUE,...",
                   help="with --search: also evaluate this layout and print the best layout's tokens/s over it, e.g. "
                        "\"tp=8,pp=1\" (dp = gpus / (tp pp) unless given; other fields from the layout flags; "
                        "--baseline alone: the layout of --tp, --pp, --dp, --micro-batch, ...); with --sweep of a "
                        "hardware parameter, the best layout at each point and its gain")
    p.add_argument("--json", action="store_true",
                   help="one JSON object on standard output (keys and units: tilecast/cluster/README.md)")
    add_parallelism_arguments(p)
    from tilecast.cli.whatif_inference import JSON_KEYS, add_arguments

    add_arguments(p)
    p.epilog = JSON_KEYS
    return p


def add_parallelism_arguments(p) -> None:
    """Experts, context parallelism and hybrid sharding: one group of flags (training; --ep, --cp,
    --capacity-factor and --expert-imbalance also with --inference)."""
    g = p.add_argument_group("mixture of experts, context parallelism, hybrid sharding")
    g.add_argument("--ep", type=int, default=1,
                   help="expert parallelism: a mixture of experts' routed experts spread over this many of the "
                        "data-parallel ranks (must divide the experts and --dp), or with --inference over this "
                        "many of the --tp GPUs (must divide --tp); tokens reach their experts by an all-to-all "
                        "dispatch and combine")
    g.add_argument("--capacity-factor", type=float, default=0.0,
                   help="each expert's buffer padded to this many times the mean load (tokens beyond dropped), "
                        "which the compute and the all-to-all carry; 0 = dropless (default)")
    g.add_argument("--expert-imbalance", type=float, default=1.0,
                   help="dropless routing: the busiest expert's tokens over the mean (>= 1), stretching the "
                        "expert compute of its rank, which the others wait for (default 1: balanced)")
    g.add_argument("--cp", type=int, default=1,
                   help="context parallelism: each sequence split over this many GPUs (ring attention: key/value "
                        "blocks passed around the ring, overlapped with attention); --seq must split into "
                        "2 x cp chunks; with --inference the prompt's prefill and the KV cache are split")
    g.add_argument("--shard-group", type=int, default=0,
                   help="with --zero 1/2/3: shard the model states over groups of this many data-parallel ranks "
                        "(e.g. a node's 8) and replicate them across groups (FSDP hybrid sharding); 0 = over "
                        "all --dp ranks (default)")


def _inputs(args):
    """The cluster and model of --cluster and --model (ClusterError, ModelConfigError: the flag in one line)."""
    from tilecast.api.cluster_calls import cluster_of
    from tilecast.cli.common import library_errors
    from tilecast.graph.model_config import load_model

    with library_errors():
        cluster, shape = cluster_of(args.cluster), load_model(args.model)
    for flag in ("gpus", "seq", "global_batch", "micro_batch", "tp", "pp", "dp", "virtual_stages", "top", "max_configs",
                 "shard_group"):
        if getattr(args, flag) < 0:
            raise UsageError(f"--{flag.replace('_', '-')}: must not be negative")
    return cluster, shape


def recipe(args) -> dict:
    """The Strategy fields of the layout flags other than the counts (tp, pp, dp, gpus, batches, seq)."""
    try:
        stage_layers = tuple(int(x) for x in args.stage_layers.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--stage-layers: expected whole numbers separated by commas, got {args.stage_layers!r}") from None
    return dict(cp=args.cp, ep=args.ep, capacity_factor=args.capacity_factor, expert_imbalance=args.expert_imbalance,
                shard_group=args.shard_group, schedule=args.schedule, virtual_stages=args.virtual_stages,
                zero=args.zero, recompute=args.recompute, sequence_parallel=args.sequence_parallel, dtype=args.dtype,
                attention=args.attention, overlap_grad_reduce=not args.no_overlap_grad_reduce,
                tp_comm_overlap=args.tp_comm_overlap, collective_algo=args.collective_algo,
                overlap_param_gather=args.overlap_param_gather,
                grad_reduce_bytes=4 if args.grad_dtype == "fp32" else 2, pipeline_split=args.pipeline_split,
                stage_layers=stage_layers)


def _gb(x):
    return f"{x / 1e9:.1f}"


def _print_result(r):
    st = r.strategy
    extra = "".join(f" {k}={st[k]}" for k in ("cp", "ep") if st.get(k, 1) != 1)
    extra += f" shard-group={st['shard_group']}" if st.get("shard_group") else ""
    print(f"{r.model} on {r.gpus} x {r.cluster}: tp={st['tp']} pp={st['pp']} dp={st['dp']}{extra} zero={st['zero']} "
          f"{st['schedule']}{'(v=%d)' % st['virtual_stages'] if st['schedule'] == 'interleaved' else ''} "
          f"recompute={st['recompute']} sp={st['sequence_parallel']} micro-batch={st['micro_batch']} "
          f"global-batch={st['global_batch']} seq={st['seq']} {st['dtype']}")
    print(f"  step {r.step_s:.4g} s   {r.tokens_per_s:,.0f} tokens/s   {r.tflops_per_gpu:.1f} TFLOP/s per GPU   "
          f"MFU {100 * r.mfu:.1f}%   HFU {100 * r.hfu:.1f}%")
    b = r.breakdown

    def part(k, label):
        return f"{label} {b[k]:.4g} s ({100 * b[k] / r.step_s:.1f}%)"

    blocking = f"tensor-parallel {b['tp_comm_s']:.4g} s"
    blocking += f", expert all-to-all {b['ep_comm_s']:.4g} s" if b.get("ep_comm_s") else ""
    blocking += f", ring attention {b['cp_comm_s']:.4g} s" if b.get("cp_comm_s") else ""
    print("  breakdown: " + "   ".join([part("compute_s", "compute"), part("exposed_comm_s", "exposed comm")
                                        + f" [{blocking}]",
                                        part("bubble_s", "pipeline bubble"), part("optimizer_s", "optimizer")])
          + f"   (overlapped comm {b['overlapped_comm_s']:.4g} s, hidden under compute)")
    m = r.memory
    verdict = "fits" if r.fits else "DOES NOT FIT"
    print(f"  memory per GPU: {_gb(m['total'])} GB of {_gb(r.memory_capacity_bytes)} GB ({verdict}): params "
          f"{_gb(m['params'])}, grads {_gb(m['grads'])}, optimizer {_gb(m['optimizer'])}, activations "
          f"{_gb(m['activations'])}, other {_gb(m['other'])}")
    print("  MFU = tokens/s x (6N + 12 L h s) / (GPUs x peak), N without input-embedding lookups; Kaplan et al. "
          "2020 (6N), PaLM appendix B (attention); HFU adds recomputed forward work"
          + ("; N: active parameters (top-k and shared experts)" if r.active_params != r.params else ""))


def run(args):
    import tilecast as tc
    from tilecast.cli.common import library_errors
    from tilecast.cli.sweep_args import sweep_pairs

    cluster, shape = _inputs(args)
    if args.inference:
        from tilecast.cli.whatif_inference import run_inference

        return run_inference(args, cluster, shape)
    if args.search:
        from tilecast.cli.whatif_search import run_search

        return run_search(args, shape, cluster)
    if args.baseline is not None:
        raise UsageError("--baseline: only with --search")
    layout = dict(gpus=args.gpus, seq=args.seq, global_batch=args.global_batch, micro_batch=args.micro_batch,
                  tp=args.tp, pp=args.pp, dp=args.dp, **recipe(args))
    swept = None
    with library_errors():
        if args.sweep:
            swept = tc.whatif_sweep(shape, cluster, sweep_pairs(args.sweep), **layout)
            res = swept.base
        else:
            res = tc.whatif(shape, cluster, **layout)
    base = res.top[0]
    if args.trace:
        from tilecast.cluster.timeline import to_trace
        from tilecast.trace import TraceError, save

        try:
            save(to_trace(base.timeline), args.trace)
        except (TraceError, OSError) as e:
            raise UsageError(f"--trace: {e}") from None
    sweeps = list(swept.tables.items()) if swept is not None else []
    if args.plot and swept is not None:
        swept.plot(args.plot)
    rc = 0 if base.fits else 1
    if not base.fits:
        print(f"tilecast whatif: the layout does not fit: it needs {_gb(base.memory_per_gpu_bytes)} GB per GPU, "
              f"{cluster.gpu.name} has {_gb(base.memory_capacity_bytes)} GB", file=sys.stderr)
    if args.json:
        obj = base.to_dict()
        if swept is not None:
            obj.update(swept.summary)
        print(json.dumps(obj))
        return rc
    _print_result(base)
    for param, df in sweeps:
        print(f"\nsweep of {param}:")
        with __import__("pandas").option_context("display.width", 200, "display.max_columns", 30,
                                                  "display.float_format", "{:.4g}".format):
            print(df.to_string(index=False))
    if args.plot:
        print(f"\nplot written to {args.plot}", file=sys.stderr)
    return rc
