"""tilecast train: a real training run on StarPU on the standard-library byte corpus."""

from __future__ import annotations

import sys

from tqdm import tqdm

from tilecast.cli import UsageError
from tilecast.cli.train_mpi import add_train_rank_args, run_train_ranks
from tilecast.cli.common import (add_json_arg, add_memory_args, add_model_args, add_recompute_arg, add_steps_arg,
                                 add_workers_arg, blas_summary, library_errors, memory_args, model_args, print_json,
                                 recompute_arg)

# A small GPT-2 (gpt2-tiny: 2 layers, n_embd 64, vocab 256) whose validation loss falls below 2.0
# after about 600 steps of 16 x 128 bytes at lr 3e-3 (1.95 at step 600, 1.79 at step 1000, measured here
# on 2 shared cores in 80 s and 171 s); the tiling splits the batch into 4 so that 2 workers have
# independent work in every phase of the step.
DEFAULTS = dict(model="gpt2-tiny", batch=16, seq=128, tile="batch=4")


def add_parser(sub):
    p = sub.add_parser(
        "train", help="train a GPT-2 or Llama model on StarPU on the Python standard library's source bytes",
        description="Train a GPT-2 or Llama model (vocab_size 256: tokens are bytes; e.g. gpt2-tiny, "
                    "llama-tiny) on StarPU with AdamW, on the Python standard library's own .py files, with a "
                    "held-out validation split. A progress bar on standard error shows the step, training loss "
                    "and tokens/s; the validation loss is "
                    "computed every --eval-every steps. --checkpoint writes parameters, AdamW moments, the step, "
                    "the data position and RNG state atomically (every --checkpoint-every steps, at the end and "
                    "on Ctrl-C); --resume continues from it and repeats exactly the losses of an uninterrupted "
                    "run. --steps counts from the start of training, resumed steps included. Under --memory-limit "
                    "the state goes into StarPU's tiles, and checkpoints are written and resumed, one tensor at "
                    "a time (no host copy of the whole model); the peak RSS is printed beside the limit "
                    "(peak_rss_bytes, memory_limit_bytes in --json).")
    add_model_args(p, **DEFAULTS)
    add_recompute_arg(p)
    p.add_argument("--sched", default="eager", metavar="NAME",
                   help="StarPU scheduling policy (default: eager, the fastest here for this small model's "
                        "short tasks; any policy the installed StarPU offers)")
    add_workers_arg(p, "the CPU workers StarPU starts (default: the number of cores, at most StarPU's limit)")
    add_steps_arg(p, 1000, "in all: training ends at step N, the steps of a resumed checkpoint included")
    p.add_argument("--lr", type=float, default=3e-3, metavar="X", help="AdamW learning rate (default: 3e-3)")
    p.add_argument("--eval-every", type=int, default=None, metavar="K",
                   help="validation loss every K steps, at step 0 and at the last step; 0: never (default: 100)")
    p.add_argument("--eval-batches", type=int, default=None, metavar="N",
                   help="validation batches (of --batch x --seq bytes, spread over the split; default: 8)")
    p.add_argument("--checkpoint", metavar="PATH", help="checkpoint file (written atomically)")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                   help="also write the checkpoint every N steps (default: 0, only at the end and on Ctrl-C)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint (an error if it cannot be used)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the weights and batches (default: 0)")
    add_memory_args(p)
    add_train_rank_args(p)
    add_json_arg(p)
    return p


def run(args) -> int:
    import tilecast as tc
    from tilecast.executor.starpu_session import StarPUError
    from tilecast.kernels.native_build import NativeUnavailable

    cfg, batch, seq, tiling = model_args(args)
    recompute = recompute_arg(args)
    from tilecast.cli.common import check_numeric

    check_numeric(cfg)
    if args.ranks is not None:
        return run_train_ranks(args, cfg, batch, seq, tiling, recompute)
    from tilecast.training.loop import TrainOptions  # its defaults where the flags are not given

    eval_every = TrainOptions.eval_every if args.eval_every is None else args.eval_every
    eval_batches = TrainOptions.eval_batches if args.eval_batches is None else args.eval_batches
    memory = memory_args(args)
    if memory is None:  # tiles in numpy arrays: the whole model in memory
        from tilecast.cli.common import check_host_memory

        check_host_memory(cfg)
    blas, blas_line = blas_summary()
    bars = []

    def progress(step, loss, tokens_per_s, val):
        if not bars:
            bars.append(tqdm(total=args.steps, initial=step - 1, desc="train", unit="step", file=sys.stderr,
                             dynamic_ncols=True))
        bars[0].update(1)
        post = dict(loss=f"{loss:.4f}", tok_s=f"{tokens_per_s:.0f}")
        if val is not None:
            post["val"] = f"{val:.4f}"
        bars[0].set_postfix(post, refresh=False)

    def log(line):
        (bars[0].write if bars else print)(line, file=sys.stderr)

    try:
        with library_errors():
            out_ = tc.train(cfg, batch, seq, tiling, steps=args.steps, lr=args.lr, sched=args.sched,
                            workers=args.workers, eval_every=eval_every, eval_batches=eval_batches,
                            checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every, resume=args.resume,
                            seed=args.seed, recompute=recompute, memory_limit=memory.limit_bytes if memory else None,
                            offload_dir=memory.offload_dir if memory else None,
                            offload_io=memory.offload_io if memory else "buffered", progress=progress, log=log)
    except NativeUnavailable as e:
        raise UsageError(str(e)) from None
    except StarPUError as e:
        print(f"tilecast train: {e}", file=sys.stderr)
        return 1
    finally:
        for bar in bars:
            bar.close()
    res = out_.result
    out = {
        "model": cfg.name, "batch": batch, "seq": seq, "tiling": str(tiling), "sched": args.sched,
        "workers": len(res.workers), "tasks_per_step": res.n_tasks, "lr": args.lr,
        "steps": res.step, "start_step": res.start_step, "interrupted": res.interrupted,
        "diverged": res.diverged,
        "final_train_loss": res.losses[-1] if res.losses else None,
        "val_losses": [{"step": s, "loss": v} for s, v in res.val],
        "final_val_loss": res.val[-1][1] if res.val else None,
        "tokens_per_s": res.tokens_per_s, "step_time_s": res.step_time_s, "wall_s": res.wall_s,
        "checkpoint": res.checkpoints[-1][1] if res.checkpoints else None,
        "losses": res.losses, "blas": blas,
        "peak_rss_bytes": res.peak_rss_bytes, "memory_limit_bytes": memory.limit_bytes if memory else None,
        "offload_dir": memory.offload_dir if memory else None,
        "offload_io": memory.offload_io if memory else None,
    }
    status = 130 if res.interrupted else 1 if res.diverged else 0
    if res.diverged:
        print(f"tilecast train: the training loss diverged at step {res.step}; try a smaller --lr (this run: "
              f"{args.lr})", file=sys.stderr)
    if res.interrupted:
        print(f"tilecast train: interrupted at step {res.step}"
              + (f"; checkpoint written, continue with --resume --checkpoint {args.checkpoint}"
                 if res.checkpoints else " (no checkpoint written)"), file=sys.stderr)
    if args.json:
        print_json(out)
        return status
    print(f"{cfg.name}, batch {batch} x {seq}, tiling {tiling}; StarPU {args.sched} on {len(res.workers)} CPU "
          f"workers; {res.n_tasks} tasks per step; AdamW lr {args.lr}")
    print(blas_line)
    print(f"steps {res.start_step + 1}-{res.step}: {res.tokens_per_s:.0f} tokens/s, {res.wall_s:.1f} s wall time")
    if res.losses:
        print(f"final training loss {res.losses[-1]:.4f}")
    for s, v in res.val:
        print(f"  validation loss at step {s:>6}: {v:.4f}")
    if res.checkpoints:
        print(f"checkpoint: {res.checkpoints[-1][1]} (step {res.checkpoints[-1][0]})")
    if memory is not None:
        from tilecast.executor.memory_limit import format_size

        over = res.peak_rss_bytes - memory.limit_bytes
        print(f"peak RSS {format_size(res.peak_rss_bytes)}, memory limit {format_size(memory.limit_bytes)} "
              f"({'+' if over >= 0 else '-'}{format_size(abs(over))}: the limit bounds StarPU's tiles; the process "
              "adds its graphs, one tensor in flight, Python and the libraries)")
    return status
