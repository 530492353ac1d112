"""tilecast run --ranks N: training steps on N StarPU-MPI processes (the flags and the output)."""

from __future__ import annotations

import sys

from tilecast.cli import UsageError
from tilecast.cli.common import blas_summary, human, library_errors, model_args, print_json, recompute_arg
from tilecast.cli.ranks_table import add_rank_args, refuse_with_ranks
from tilecast.executor.mpi_threads import HELPER_NICE


def add_mpi_args(p) -> None:
    add_rank_args(p, "run the step on N StarPU-MPI processes started with mpirun (or, under an mpirun you "
                     "started, as its processes), each with --workers CPU workers (default 1 with --ranks); "
                     "prints step times, tasks and bytes per rank, measured and as StarPU-MPI's rules predict "
                     "(docs/mpi.md)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="with --ranks: end every process after S seconds (default: 600)")
    p.add_argument("--mpi-calls", action="store_true",
                   help="with --ranks: time every MPI call of the ranks (an interposer preloaded into them; the "
                        "steps run a few percent slower) and draw their posts and completions in --trace's file, "
                        "on each rank's 'MPI calls (timed)' track")


def run_mpi_cmd(args) -> int:
    import tilecast as tc
    from tilecast.executor.mpi_launch import MPIRunError
    from tilecast.kernels.native_build import NativeUnavailable

    refuse_with_ranks(args)
    if args.mpi_calls and not args.trace:
        raise UsageError("--mpi-calls: with --trace FILE (the calls are drawn in the trace)")
    cfg, batch, seq, tiling = model_args(args)
    recompute = recompute_arg(args)
    if args.trace and not args.trace.lower().endswith((".parquet", ".csv", ".json")):
        raise UsageError(f"--trace: unknown file type of {args.trace!r} (use .parquet, .csv or .json)")
    workers = 1 if args.workers is None else args.workers
    blas, blas_line = blas_summary()
    try:
        with library_errors({"timeout_s": "--timeout", "mpi_calls": "--mpi-calls"}):
            got = tc.run_ranks(cfg, batch, seq, tiling, args.sched, workers, args.steps, args.ranks,
                               args.distribution, seed=args.seed, check=args.check, timeout_s=args.timeout,
                               recompute=recompute, mpi_calls=args.mpi_calls)
    except NativeUnavailable as e:
        raise UsageError(str(e)) from None
    except MPIRunError as e:
        print(f"tilecast run: {e}", file=sys.stderr)
        return 1
    if got is None:  # a rank other than 0 under the user's mpirun: rank 0 reports
        return 0
    res, out = got.result, {**got.summary, "blas": blas}
    if args.trace:
        from tilecast.executor.mpi_trace import merged_trace, save_merged

        save_merged(merged_trace(res), args.trace, res)
        out["trace"] = args.trace
    ok = res.check is None or res.check["ok"]
    pred, rows = res.predicted, out["per_rank"]
    if args.json:
        print_json(out)
        return 0 if ok else 1
    print(f"{cfg.name}, batch {batch} x {seq}, tiling {tiling}; StarPU-MPI, {res.ranks} ranks of {workers} CPU "
          f"worker(s), distribution {res.distribution}, {args.sched} on each; {res.n_tasks} tasks per step")
    print(blas_line)
    print("threads: " + ("StarPU-MPI's progress thread runs worker 0" if res.progress_drives_worker
                         else "StarPU-MPI's progress thread has a thread of its own")
          + (f"; each rank's main thread on its worker's core, the rank's other threads {HELPER_NICE} nice levels "
             f"below it" if res.main_first else "; every thread at one level (the ranks' workers share the cores)"))
    print(f"\n{'step':>5}{'time s':>10}{'tokens/s':>12}{'moved':>12}{'loss':>10}")
    for t, (dt, moved) in enumerate(zip(res.step_s, res.bytes_moved)):
        loss = f"{res.losses[t]:>10.4f}" if t < len(res.losses) else ""
        print(f"{t + 1:>5}{dt:>10.4f}{res.tokens_per_step / dt:>12.1f}{human(moved, 'B'):>12}{loss}")
    print(f"\n{'rank':>5}{'tasks':>8}{'(model)':>9}{'sent':>12}{'(model)':>12}{'received':>12}{'(model)':>12}"
          f"{'step s':>9}")
    for r in rows:
        print(f"{r['rank']:>5}{r['tasks']:>8}{r['tasks_predicted']:>9}{human(r['bytes_sent'], 'B'):>12}"
              f"{human(r['bytes_sent_predicted'], 'B'):>12}{human(r['bytes_received'], 'B'):>12}"
              f"{human(r['bytes_received_predicted'], 'B'):>12}{r['step_s']:>9.4f}")
    print(f"\nmedian of steps after the first: {res.median_step_s:.4f} s (the slowest rank, barrier to every task "
          f"and message done); moved {human(res.bytes_moved[-1], 'B')} in the last step, "
          f"{human(pred['bytes_moved'], 'B')} predicted")
    if args.trace:
        print(f"trace of the last step, every rank: {args.trace}")
    if res.check is not None:
        c = res.check
        print(f"check against the single-process numpy reference: loss {c['loss']:.2e}, gradients {c['grads']:.2e}, "
              f"parameters {c['params']:.2e} -> {'ok' if c['ok'] else 'FAILED: ' + ', '.join(c['failures'][:5])}")
    return 0 if ok else 1
