"""tilecast train --ranks N: training on N StarPU-MPI processes, each checkpointing its own shards."""

from __future__ import annotations

import os
import sys

from tilecast.cli import UsageError
from tilecast.cli.common import as_flags, print_json
from tilecast.errors import FieldError
from tilecast.graph import TilingError
from tilecast.graph.model_config import ModelConfigError


def add_train_rank_args(p) -> None:
    from tilecast.cli.ranks_table import add_rank_args

    add_rank_args(p, "train on N StarPU-MPI processes started with mpirun (each --workers CPU workers, default 1); "
                     "--checkpoint is then a directory: each rank writes the parameter and AdamW tiles it owns, "
                     "rank 0 one manifest.json (docs/mpi.md)")
    p.add_argument("--timeout", type=float, default=3600.0, metavar="S",
                   help="with --ranks: end every process after S seconds (default: 3600)")


def run_train_ranks(args, cfg, batch, seq, tiling, recompute) -> int:
    from tilecast.cli.ranks_table import distribute_args
    from tilecast.data.checkpoint import CheckpointError
    from tilecast.data.corpus import VOCAB_SIZE, DataError, load_corpus
    from tilecast.data.mpi_checkpoint import read_manifest
    from tilecast.executor.mpi_launch import MPIRunError, run_mpi
    from tilecast.graph.models import build_step
    from tilecast.kernels.native_build import NativeUnavailable

    if cfg.vocab_size != VOCAB_SIZE:
        raise UsageError(f"--model: vocab_size must be {VOCAB_SIZE} to train on the byte corpus, got {cfg.vocab_size}")
    for flag, v, low in (("--steps", args.steps, 1), ("--checkpoint-every", args.checkpoint_every, 0)):
        if v < low:
            raise UsageError(f"{flag} must be at least {low}, got {v}")
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout}")
    if (args.resume or args.checkpoint_every) and not args.checkpoint:
        raise UsageError(f"{'--resume' if args.resume else '--checkpoint-every'} needs --checkpoint DIR")
    distribute_args(build_step(cfg, batch, seq, tiling, recompute=recompute), args)
    try:
        corpus = load_corpus()
    except DataError as e:
        raise UsageError(str(e)) from None
    settings = {"model": cfg.to_dict(), "tiling": str(tiling), "batch": batch, "seq": seq, "seed": args.seed,
                "lr": args.lr, "ranks": args.ranks, "distribution": args.distribution, "corpus": corpus.key,
                "recompute": recompute}
    start = 0
    folder = os.path.abspath(args.checkpoint) if args.checkpoint else None
    if folder and args.resume:
        try:
            start = int(read_manifest(folder, settings)["step"])
        except CheckpointError as e:
            raise UsageError(str(e)) from None
    elif folder:
        if os.path.exists(os.path.join(folder, "manifest.json")):
            raise UsageError(f"--checkpoint: {folder} holds a checkpoint; add --resume to continue from it")
        os.makedirs(folder, exist_ok=True)
    if start >= args.steps:
        raise UsageError(f"--steps: the checkpoint is at step {start}; ask for more than {start} steps")
    workers = 1 if args.workers is None else args.workers
    train = {"folder": folder, "resume": bool(args.resume), "every": args.checkpoint_every, "settings": settings}
    try:
        res = run_mpi(cfg, batch, seq, tiling, args.sched, workers, args.steps - start, args.ranks,
                      args.distribution, seed=args.seed, lr=args.lr, timeout_s=args.timeout, recompute=recompute,
                      train=train)
    except NativeUnavailable as e:
        raise UsageError(str(e)) from None
    except (FieldError, ModelConfigError, TilingError) as e:  # bad input, named by its field
        raise UsageError(as_flags(str(e), {"timeout_s": "--timeout"})) from None
    except MPIRunError as e:
        print(f"tilecast train: {e}", file=sys.stderr)
        return 1
    if res is None:
        return 0
    out = {"model": cfg.name, "batch": batch, "seq": seq, "tiling": str(tiling), "sched": args.sched,
           "ranks": res.ranks, "distribution": res.distribution, "workers_per_rank": workers,
           "start_step": start, "steps": args.steps, "losses": res.losses,
           "final_train_loss": res.losses[-1] if res.losses else None, "step_time_s": res.median_step_s,
           "tokens_per_s": res.tokens_per_step / res.median_step_s, "bytes_moved": res.bytes_moved[-1],
           "checkpoint": os.path.join(folder, "manifest.json") if folder else None}
    if args.json:
        print_json(out)
        return 0
    print(f"{cfg.name}, batch {batch} x {seq}, tiling {tiling}; StarPU-MPI, {res.ranks} ranks of {workers} worker(s), "
          f"distribution {res.distribution}, {args.sched}; AdamW lr {args.lr}")
    print(f"steps {start + 1}-{args.steps}: {out['tokens_per_s']:.0f} tokens/s (median step "
          f"{res.median_step_s * 1e3:.1f} ms), {out['bytes_moved']} bytes moved per step")
    if res.losses:
        print(f"final training loss {res.losses[-1]:.4f}")
    if folder:
        print(f"checkpoint: {out['checkpoint']} (step {args.steps}; one shard per rank beside it)")
    return 0
