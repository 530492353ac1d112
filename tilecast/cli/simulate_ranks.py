"""tilecast simulate --ranks N: predict a step on N StarPU-MPI ranks (the flags and the output)."""

from __future__ import annotations

import sys
import time

from tilecast.cli import UsageError
from tilecast.cli.common import human, print_json
from tilecast.errors import FieldError


def add_network_arg(p) -> None:
    p.add_argument("--network", metavar="LAT_US,MSG_US,GBPS",
                   help="with --ranks: the network between ranks as MPI latency (us), StarPU-MPI's cost per "
                        "message (us) and bandwidth (GB/s), instead of the one tilecast calibrate --ranks stored")
    p.add_argument("--background-threads", type=float, default=0.0, metavar="N",
                   help="with --ranks: runnable threads of other work on the machine; with the ranks' own "
                        "threads they share its cores in time slices (default 0)")


def background_arg(args) -> float:
    """--background-threads, a number >= 0; UsageError naming the flag otherwise."""
    bg = getattr(args, "background_threads", 0.0) or 0.0
    if not bg >= 0:
        raise UsageError(f"--background-threads: expected a number of threads >= 0, got {bg}")
    return float(bg)


def network_arg(args, machine, ranks: int, workers: int):
    """The network from --network, else the stored one; UsageError naming the flag otherwise."""
    from tilecast.loop.ranks_forecast import network_or_error
    from tilecast.perfmodel.network import Network

    if getattr(args, "network", None):
        expected = f"--network: expected LAT_US,MSG_US,GBPS (three numbers, bandwidth > 0), got {args.network!r}"
        try:
            lat, msg, gbps = (float(x) for x in args.network.split(","))
        except ValueError:  # not three numbers
            raise UsageError(expected) from None
        try:
            return Network(latency_s=lat * 1e-6, message_s=msg * 1e-6, bandwidth_Bps=gbps * 1e9,
                           source="--network", ranks=ranks, workers_per_rank=workers)
        except FieldError as e:  # a number out of range, named by the network's field
            raise UsageError(f"{expected} ({e})") from None
    try:
        return network_or_error(machine, ranks, workers)
    except LookupError as e:
        raise UsageError(f"--ranks: {e} (or give --network)") from None


def run_ranks(args, cfg, batch, seq, tiling, recompute) -> int:
    from tilecast.cli.ranks_table import distribute_args
    from tilecast.graph.models import build_step
    from tilecast.loop.predict import stored_models
    from tilecast.perfmodel import MachineError, load_machine
    from tilecast.simulator import SimulationError
    from tilecast.loop.ranks_forecast import forecast_ranks

    built = build_step(cfg, batch, seq, tiling, recompute=recompute)
    distribute_args(built, args)  # a rank count the distribution cannot use: one line, before anything else
    workers = 1 if args.workers is None else args.workers
    try:
        machine = load_machine(args.machine)
        machine.with_workers(workers)
    except MachineError as e:
        raise UsageError(f"--machine/--workers: {e}") from None
    net = network_arg(args, machine, args.ranks, workers)
    background = background_arg(args)
    calibration, host_costs = stored_models(machine)
    print(f"simulating {cfg.name} on {args.ranks} ranks of {workers} worker(s), distribution "
          f"{args.distribution}, {args.sched} on each", file=sys.stderr)
    t0 = time.perf_counter()
    try:
        f = forecast_ranks(cfg, batch, seq, tiling, args.sched, args.ranks, args.distribution, machine,
                           calibration, host_costs, net, workers, recompute, built=built, background=background)
    except SimulationError as e:
        print(f"tilecast simulate: {e}", file=sys.stderr)
        return 1
    out = {**f.row(), "makespan_s": f.step_s, "machine": machine.name,
           "calibration": "stored" if calibration is not None else "none (machine roofline figures)",
           "task_overhead_us": f.summary["task_overhead_s"] * 1e6, "network": f.summary["network"],
           "bytes_matrix": f.summary["bytes_matrix"], "utilization": f.summary["utilization"],
           "per_rank": f.summary["per_rank"], "threads": f.summary.get("threads"), "nic": f.summary.get("nic"),
           "simulation_s": time.perf_counter() - t0}
    if args.json:
        print_json(out)
        return 0
    n = out["network"]
    print(f"{cfg.name}, batch {batch} x {seq}, tiling {tiling.describe()}; {args.ranks} ranks of {workers} "
          f"worker(s) of {machine.name}, distribution {args.distribution}, {args.sched} on each; kernel "
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
