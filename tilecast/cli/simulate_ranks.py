"""tilecast simulate --ranks N: predict a step on N StarPU-MPI ranks (the flags and the output)."""

from __future__ import annotations

import sys

from tilecast.cli import UsageError
from tilecast.cli.common import human, library_errors, print_json


def add_network_arg(p) -> None:
    p.add_argument("--network", metavar="LAT_US,MSG_US,GBPS",
                   help="with --ranks: the network between ranks as MPI latency (us), StarPU-MPI's cost per "
                        "message (us) and bandwidth (GB/s), instead of the one tilecast calibrate --ranks stored")
    p.add_argument("--background-threads", type=float, default=0.0, metavar="N",
                   help="with --ranks: runnable threads of other work on the machine; with the ranks' own "
                        "threads they share its cores in time slices (default 0)")


def network_arg(args):
    """The (latency us, cost per message us, bandwidth GB/s) of --network, or None (the stored network)."""
    if not getattr(args, "network", None):
        return None
    try:
        lat, msg, gbps = (float(x) for x in args.network.split(","))
    except ValueError:  # not three numbers
        raise UsageError(f"--network: expected LAT_US,MSG_US,GBPS (three numbers, bandwidth > 0), "
                         f"got {args.network!r}") from None
    return lat, msg, gbps


RANK_FLAGS = {"background_threads": "--background-threads", "workers": "--workers"}


def run_ranks(args, cfg, batch, seq, tiling, recompute) -> int:
    import tilecast as tc
    from tilecast.simulator import SimulationError

    workers = 1 if args.workers is None else args.workers
    try:
        with library_errors(RANK_FLAGS):
            res = tc.simulate_ranks(cfg, batch, seq, tiling, args.machine, args.sched, args.ranks, args.distribution,
                                    workers, network_arg(args), args.background_threads, recompute,
                                    progress=lambda line: print(line, file=sys.stderr))
    except SimulationError as e:
        print(f"tilecast simulate: {e}", file=sys.stderr)
        return 1
    out, f = res.summary, res.forecast
    if args.json:
        print_json(out)
        return 0
    n = out["network"]
    print(f"{cfg.name}, batch {batch} x {seq}, tiling {tiling.describe()}; {args.ranks} ranks of {workers} "
          f"worker(s) of {res.machine}, distribution {args.distribution}, {args.sched} on each; kernel "
          f"durations: {out['calibration']}")
    print()
    print(f"predicted step      {f.step_s * 1e3:.3f} ms  (the slowest rank's last task or message)")
    print(f"tasks               {f.tasks}  ({human(f.summary['flops'])}flop)")
    print(f"moved per step      {human(f.bytes_moved, 'B')} in {f.messages} messages")
    print(f"network             {n['latency_s'] * 1e6:.1f} us latency + {n['message_s'] * 1e6:.1f} us per message"
          f" + bytes / {human(n['bandwidth_Bps'], 'B/s')} ({n['source']})")
    th = f.summary.get("threads")
    if th:
        who = "runs worker 0" if th["progress_drives_worker"] else "has a thread of its own"
        print(f"threads             {th['threads']} runnable on {th['cores']} cores (the progress thread {who}); "
              f"kernels {f.core_share:.2f}x longer in {th['slice_s'] * 1e3:.2f} ms slices")
    print(f"network interfaces  {'one per rank, shared by its messages' if f.summary.get('nic') == 'node' else 'a link per pair of ranks'}")
    print(f"cost per task       {out['task_overhead_us']:.2f} us")
    print()
    print(f"{'rank':>5}{'tasks':>9}{'busy ms':>10}{'end ms':>10}{'sent':>12}{'received':>12}{'link busy ms':>14}")
    for r in out["per_rank"]:
        print(f"{r['rank']:>5}{r['tasks']:>9}{r['busy_s'] * 1e3:>10.2f}{r['end_s'] * 1e3:>10.2f}"
              f"{human(r['bytes_sent'], 'B'):>12}{human(r['bytes_received'], 'B'):>12}{r['link_busy_s'] * 1e3:>14.2f}")
    print(f"simulated in        {out['simulation_s']:.2f} s")
    return 0
