"""tilecast tune --ranks N: rank tilings, distributions and schedulers on N StarPU-MPI ranks by simulation."""

from __future__ import annotations

import sys

from tqdm import tqdm

from tilecast.cli import UsageError
from tilecast.cli.common import human, library_errors, print_json


def add_tune_rank_args(p) -> None:
    from tilecast.cli.simulate_ranks import add_network_arg

    p.add_argument("--ranks", type=int, default=None, metavar="N",
                   help="rank configurations on N StarPU-MPI ranks of one worker each (--workers: per rank): "
                        "every tiling x --distributions x --scheds, by the rank simulator (docs/mpi.md); no "
                        "--execute")
    p.add_argument("--distributions", default="data,layer,cyclic", metavar="LIST",
                   help="with --ranks: distributions to rank (default: data,layer,cyclic)")
    add_network_arg(p)


def run_tune_ranks(args, cfg, batch, seq, tilings, scheds, recompute) -> int:
    import tilecast as tc
    from tilecast.cli.simulate_ranks import RANK_FLAGS, network_arg
    from tilecast.cli.tune_cmd import parse_list

    if args.execute:
        raise UsageError("--execute: not with --ranks (run a configuration with tilecast run --ranks)")
    dists = parse_list(args.distributions, "--distributions")
    wpr = 1 if args.workers is None else args.workers  # --workers N: workers per rank
    with tqdm(unit="config", file=sys.stderr, leave=False) as bar:

        def progress(n, total):
            bar.total = total
            bar.update(n)

        with library_errors({**RANK_FLAGS, "tiles": "--tiles"}):
            res = tc.tune_ranks(cfg, batch, seq, args.machine, args.ranks, tilings, scheds, dists, wpr,
                                args.max_tasks, network_arg(args), args.background_threads, recompute,
                                progress=progress)
    out, rows, skipped = res.summary, res.ranking, res.skipped
    net = out["network"]
    if args.json:
        print_json(out)
        return 0
    print(f"{cfg.name}, batch {batch} x {seq} on {args.ranks} ranks of {wpr} worker(s) of {res.machine}: "
          f"{len(rows)} configurations simulated; kernels: {out['calibration']}; network: {net['source']}")
    for s in skipped:
        print(f"  skipped {s['tiling']}" + (f" with {s['distribution']}" if "distribution" in s else "")
              + f": {s['reason']}")
    print()
    print(f"{'#':>3} {'tiling':<24} {'distribution':<13}{'sched':<7}{'step ms':>10}{'tokens/s':>11}{'moved':>12}"
          f"{'msgs':>7}{'tasks':>8}")
    for i, r in enumerate(rows[:args.top]):
        print(f"{i + 1:>3} {r['label']:<24} {r['distribution']:<13}{r['sched']:<7}{r['pred_step_s'] * 1e3:>10.2f}"
              f"{r['tokens_per_s']:>11.0f}{human(r['bytes_moved'], 'B'):>12}{r['messages']:>7}{r['tasks']:>8}")
    if len(rows) > args.top:
        print(f"... {len(rows) - args.top} more (--top N, --json)")
    return 0
