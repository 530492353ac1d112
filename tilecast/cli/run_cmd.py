"""tilecast run: training steps executed for real on StarPU, timed."""

from __future__ import annotations

import sys

import numpy as np
from tqdm import tqdm

from tilecast.cli import UsageError
from tilecast.cli.common import (add_json_arg, add_memory_args, add_model_args, add_recompute_arg, add_steps_arg,
                                 add_workers_arg, blas_summary, library_errors, memory_args, model_args, print_json,
                                 recompute_arg)
from tilecast.cli.run_mpi import add_mpi_args, run_mpi_cmd


def add_parser(sub):
    p = sub.add_parser(
        "run", help="execute training steps on StarPU and time them",
        description="Build the tiled training step, run it --steps times on the StarPU runtime (random tokens; "
                    "parameters and AdamW states stay in their tiles between steps) and print each step's time, "
                    "tokens/s and achieved GFLOP/s. Figures in the summary and in --json are medians over the "
                    "steps after the first (the first warms up and calibrates StarPU's performance models). "
                    "--check compares the first step with the numpy reference execution (exit 1 on mismatch).")
    add_model_args(p, model="gpt2-tiny", batch=4, seq=64, tile="64")
    add_recompute_arg(p)
    p.add_argument("--sched", default="dmda", metavar="NAME",
                   help="StarPU scheduling policy (default: dmda; any policy the installed StarPU offers)")
    add_workers_arg(p, "the CPU workers StarPU starts (default: the number of cores, at most StarPU's limit)")
    add_steps_arg(p, 3, "(the summary's medians leave out the first, which warms up StarPU's performance models)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the weights and tokens (default: 0)")
    p.add_argument("--check", action="store_true",
                   help="compare the first step with the numpy reference (loss 1e-5, gradients and "
                        "parameters 1e-4 relative); exit 1 on a mismatch")
    p.add_argument("--trace", metavar="FILE",
                   help="write the last step's trace: .parquet or .csv table, or .json Chrome trace (Perfetto)")
    add_mpi_args(p)
    add_memory_args(p)
    add_json_arg(p)
    return p


def run(args) -> int:
    if args.ranks is not None:
        return run_mpi_cmd(args)
    if args.mpi_calls:
        raise UsageError("--mpi-calls: only with --ranks (the MPI calls of StarPU-MPI processes)")
    import tilecast as tc
    from tilecast.executor.memory_limit import format_size
    from tilecast.executor.starpu_session import StarPUError
    from tilecast.kernels.native_build import NativeUnavailable
    from tilecast import trace as tracefile

    cfg, batch, seq, tiling = model_args(args)
    recompute = recompute_arg(args)
    memory = memory_args(args)
    from tilecast.cli.common import check_numeric

    check_numeric(cfg)
    if memory is None:  # tiles in numpy arrays: the whole model in memory
        from tilecast.cli.common import check_host_memory

        check_host_memory(cfg)
    if args.steps < 1:
        raise UsageError(f"--steps must be at least 1, got {args.steps}")
    if args.trace and not args.trace.lower().endswith((".parquet", ".csv", ".json")):
        raise UsageError(f"--trace: unknown file type of {args.trace!r} (use .parquet, .csv or .json)")
    blas, blas_line = blas_summary()
    bars = []

    def progress(t, dt, loss):
        if not bars:
            bars.append(tqdm(total=args.steps, initial=0, desc="steps", unit="step", file=sys.stderr, leave=False))
        bar = bars[0]
        bar.update(1)
        bar.set_postfix(step_s=f"{dt:.3f}", loss=f"{loss:.4f}")

    try:
        with library_errors():
            res = tc.run(cfg, batch, seq, tiling, args.sched, args.workers, args.steps, seed=args.seed,
                         check=args.check, recompute=recompute, memory_limit=memory.limit_bytes if memory else None,
                         offload_dir=memory.offload_dir if memory else None,
                         offload_io=memory.offload_io if memory else "buffered", progress=progress, forecast=True)
    except NativeUnavailable as e:
        raise UsageError(str(e)) from None
    except StarPUError as e:
        print(f"tilecast run: {e}", file=sys.stderr)
        return 1
    finally:
        for bar in bars:
            bar.close()
    if args.trace:
        tracefile.save(res.trace, args.trace, res.graph)  # the last step's, with its step time
    ok = res.check is None or res.check["ok"]
    out = {
        "model": cfg.name, "batch": batch, "seq": seq, "tiling": str(tiling), "recompute": recompute,
        "sched": args.sched,
        "workers": res.workers, "tasks": res.tasks, "steps": args.steps,
        "step_s": res.step_s, "makespan_s": res.makespan_s,
        "host_s": res.host_s, "tokens_per_s": res.tokens_per_s, "gflops": res.gflops,
        "step_times_s": res.step_times_s, "makespans_s": res.makespans_s, "losses": res.losses,
        "flops_per_step": res.flops_per_step, "blas": blas,
        "memory_limit_bytes": memory.limit_bytes if memory else None,
        "offload_dir": memory.offload_dir if memory else None,
        "offload_io": memory.offload_io if memory else None,
        "disk_written_bytes": res.disk_written_bytes, "disk_read_bytes": res.disk_read_bytes,
        "disk_writes": res.disk_writes, "disk_reads": res.disk_reads,
        "peak_rss_bytes": res.peak_rss_bytes,
    }
    if res.check is not None:
        out["check"] = res.check
    if args.trace:
        out["trace"] = args.trace
    if res.predicted is not None:
        out["predicted"] = res.predicted
    if args.json:
        print_json(out)
        return 0 if ok else 1
    print(f"{cfg.name}, batch {batch} x {seq}, tiling {tiling}, recompute {recompute}; StarPU {args.sched} on {res.workers} CPU "
          f"workers; {res.tasks} tasks, {res.flops_per_step / 1e9:.2f} GFLOP per step")
    print(blas_line)
    print(f"\n{'step':>5}{'time s':>10}{'tokens/s':>12}{'GFLOP/s':>10}{'loss':>10}")
    for t, (dt, loss) in enumerate(zip(res.step_times_s, res.losses)):
        print(f"{t + 1:>5}{dt:>10.4f}{batch * seq / dt:>12.1f}{res.flops_per_step / dt / 1e9:>10.2f}"
              f"{loss:>10.4f}")
    print(f"\nmedian of steps after the first: {res.step_s:.4f} s, {res.tokens_per_s:.1f} tokens/s, "
          f"{res.gflops:.2f} GFLOP/s; {1e3 * res.host_s:.2f} ms of each step outside the task graph")
    if memory is not None:
        steps = slice(1, None) if len(res.disk_written_bytes) > 1 else slice(None)
        print(f"memory limit {format_size(memory.limit_bytes)}"
              + (f", offload to {memory.offload_dir}: per step (median after the first) "
                 f"{format_size(np.median(res.disk_written_bytes[steps]))} written to disk, "
                 f"{format_size(np.median(res.disk_read_bytes[steps]))} read" if memory.offload_dir else ", no disk node")
              + f"; peak RSS {format_size(res.peak_rss_bytes)}")
        f = out.get("predicted")
        if f and "error" not in f:
            print(f"forecast of a step: {f['step_s']:.4f} s, {format_size(f['disk_written_bytes'])} written to disk, "
                  f"{format_size(f['disk_read_bytes'])} read ({f['evictions']} evictions, {f['writebacks']} "
                  f"write-backs; tilecast simulate --memory-limit)")
        elif f:
            print(f"forecast of a step: {f['error']}")
    if args.trace:
        print(f"trace of the last step: {args.trace}")
    if res.check is not None:
        c = res.check
        print(f"check against the numpy reference: loss {c['loss']:.2e}, gradients {c['grads']:.2e}, "
              f"parameters (AdamW on the step's gradients) {c['params']:.2e} -> {'ok' if c['ok'] else 'FAILED: ' + ', '.join(c['failures'][:5])}")
    return 0 if ok else 1
