"""tilecast tune --ranks N: rank tilings, distributions and schedulers on N StarPU-MPI ranks by simulation."""

from __future__ import annotations

import sys

from tqdm import tqdm

from tilecast.cli import UsageError
from tilecast.cli.common import as_flags, human, print_json
from tilecast.errors import FieldError
from tilecast.loop.candidates import short_label


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
    from tilecast.cli.simulate_ranks import background_arg, network_arg
    from tilecast.cli.tune_cmd import parse_list
    from tilecast.graph.distribution import DISTRIBUTIONS
    from tilecast.loop.predict import stored_models
    from tilecast.loop.tune import build_candidates, usable_scheds
    from tilecast.perfmodel import MachineError, load_machine
    from tilecast.loop.ranks_forecast import forecast_ranks

    if args.ranks < 2:
        raise UsageError(f"--ranks must be at least 2, got {args.ranks}")
    if args.execute:
        raise UsageError("--execute: not with --ranks (run a configuration with tilecast run --ranks)")
    dists = parse_list(args.distributions, "--distributions")
    bad = [d for d in dists if d not in DISTRIBUTIONS]
    if bad:
        raise UsageError(f"--distributions: unknown distribution {bad[0]!r}; choose from {', '.join(DISTRIBUTIONS)}")
    wpr = 1 if args.workers is None else args.workers  # --workers N: workers per rank
    try:
        machine = load_machine(args.machine)
        machine.with_workers(wpr)
    except MachineError as e:
        raise UsageError(f"--machine/--workers: {e}") from None
    scheds = usable_scheds(scheds)
    if not scheds:
        raise UsageError("--scheds: none of them is both simulated and offered by StarPU")
    net = network_arg(args, machine, args.ranks, wpr)
    background = background_arg(args)
    calibration, host_costs = stored_models(machine)
    graphs, skipped = build_candidates(cfg, batch, seq, tilings, args.max_tasks, recompute)
    rows = []
    with tqdm(total=len(graphs) * len(dists) * len(scheds), unit="config", file=sys.stderr, leave=False) as bar:
        for tiling, g in graphs:
            for d in dists:
                for s in scheds:
                    bar.update(1)
                    try:
                        f = forecast_ranks(cfg, batch, seq, tiling, s, args.ranks, d, machine, calibration,
                                           host_costs, net, wpr, recompute, built=g, background=background)
                    except FieldError as e:
                        if e.field != "ranks":
                            raise UsageError(as_flags(str(e))) from None
                        # the distribution cannot use that many ranks with this tiling
                        skipped.append({"tiling": tiling.describe(), "distribution": d, "reason": e.detail})
                        break
                    rows.append(f.row() | {"label": short_label(tiling)})
    rows.sort(key=lambda r: (r["pred_step_s"], r["bytes_moved"], r["tasks"], r["label"], r["distribution"]))
    out = {"model": cfg.name, "batch": batch, "seq": seq, "recompute": recompute, "machine": machine.name,
           "ranks": args.ranks, "workers_per_rank": wpr, "configurations": len(rows), "skipped": skipped,
           "calibration": "stored" if calibration is not None else "none (machine roofline figures)",
           "network": {"latency_s": net.latency_s, "message_s": net.message_s, "bandwidth_Bps": net.bandwidth_Bps,
                       "source": net.source},
           "ranking": rows}
    if args.json:
        print_json(out)
        return 0
    print(f"{cfg.name}, batch {batch} x {seq} on {args.ranks} ranks of {wpr} worker(s) of {machine.name}: "
          f"{len(rows)} configurations simulated; kernels: {out['calibration']}; network: {net.source}")
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
