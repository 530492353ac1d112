"""tilecast train --ranks N: training on N StarPU-MPI processes, each checkpointing its own shards."""

from __future__ import annotations

import sys

from tilecast.cli import UsageError
from tilecast.cli.common import library_errors, print_json


def add_train_rank_args(p) -> None:
    from tilecast.cli.ranks_table import add_rank_args

    add_rank_args(p, "train on N StarPU-MPI processes started with mpirun (each --workers CPU workers, default 1); "
                     "--checkpoint is then a directory: each rank writes the parameter and AdamW tiles it owns, "
                     "rank 0 one manifest.json (docs/mpi.md)")
    p.add_argument("--timeout", type=float, default=3600.0, metavar="S",
                   help="with --ranks: end every process after S seconds (default: 3600)")


def run_train_ranks(args, cfg, batch, seq, tiling, recompute) -> int:
    import tilecast as tc
    from tilecast.cli.ranks_table import refuse_with_ranks
    from tilecast.executor.mpi_launch import MPIRunError
    from tilecast.kernels.native_build import NativeUnavailable

    refuse_with_ranks(args)
    workers = 1 if args.workers is None else args.workers
    try:
        with library_errors({"timeout_s": "--timeout"}):
            got = tc.train_ranks(cfg, batch, seq, tiling, args.steps, args.lr, args.sched, workers, args.ranks,
                                 args.distribution, args.checkpoint, args.checkpoint_every, args.resume, args.seed,
                                 args.timeout, recompute)
    except NativeUnavailable as e:
        raise UsageError(str(e)) from None
    except MPIRunError as e:
        print(f"tilecast train: {e}", file=sys.stderr)
        return 1
    if got is None:
        return 0
    out, res, start, folder = got.summary, got.result, got.start_step, got.checkpoint
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
        print(f"checkpoint: {folder} (step {args.steps}; one shard per rank beside it)")
    return 0
