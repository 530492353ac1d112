"""tilecast calibrate --ranks N: what a message between StarPU-MPI ranks costs here (a ping-pong), stored."""

from __future__ import annotations

import sys

from tilecast.cli import UsageError
from tilecast.cli.common import human, library_errors, print_json
from tilecast.executor.mpi_pingpong import DEFAULT_SIZES


def add_rank_calibration_args(p) -> None:
    p.add_argument("--ranks", type=int, nargs="?", const=2, default=None, metavar="N",
                   help="instead of the kernels, measure the network between N StarPU-MPI ranks (default N: 2): "
                        "a ping-pong of rank 0 with rank 1 over --sizes, first with plain MPI, then through "
                        "StarPU-MPI with the workers running; fitted as latency + StarPU-MPI's cost per message "
                        "+ bytes / bandwidth and stored for simulate/tune --ranks (docs/mpi.md)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="with --ranks: CPU workers per rank, as tilecast run --ranks starts them (default: 1)")
    p.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), metavar="LIST",
                   help="with --ranks: message sizes in bytes (default: 8 B to 1 MiB, on both sides of Open MPI's "
                        "eager and rendezvous limits)")
    p.add_argument("--round-trips", type=int, default=30, metavar="N",
                   help="with --ranks: timed round trips per size (default: 30)")
    p.add_argument("--no-probe", action="store_true",
                   help="run no probe steps: without --ranks, the executor's costs per task and per step are not "
                        "measured (simulate then leaves the host cost out until tune or a run measures it), nor, with "
                        "--offload-dir, the disk traffic's computing time, the device's write-back rate and "
                        "StarPU's costs under a limit; with "
                        "--ranks, no probe step (by default a probe step, gpt2-tiny, layer, 2 runs, measures each "
                        "rank's submission time per task and reports the cost per message the rank simulator "
                        "would need to match it, then 2 more runs with every MPI call timed measure the worker's "
                        "CPU per message; the stored cost per message is the ping-pong's either way)")


def run_rank_calibration(args) -> int:
    import tilecast as tc
    from tilecast.executor.mpi_launch import MPIRunError
    from tilecast.kernels.native_build import NativeUnavailable

    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"--sizes: expected comma-separated byte counts, got {args.sizes!r}") from None
    try:
        with library_errors():
            res = tc.calibrate_network(args.ranks, args.workers, sizes, args.round_trips, probe=not args.no_probe,
                                       progress=not args.json)
    except NativeUnavailable as e:
        raise UsageError(str(e)) from None
    except MPIRunError as e:
        print(f"tilecast calibrate: {e}", file=sys.stderr)
        return 1
    out, net, probe, path = res.summary, res.network, res.probe, res.file
    if args.json:
        print_json(out)
        return 0
    print(f"network between {net.ranks} ranks of {net.workers_per_rank} worker(s): {net.transport}")
    print(f"  MPI latency                 {net.latency_s * 1e6:10.1f} us (plain MPI ping-pong, one way)")
    print(f"  StarPU-MPI cost per message {net.message_s * 1e6:10.1f} us "
          f"(its ping-pong less MPI's latency)")
    print(f"  bandwidth                   {human(net.bandwidth_Bps, 'B/s'):>13} (StarPU-MPI ping-pong's slope)")
    if net.eager_limit() is not None:
        extra = net.protocol_s or {}
        print(f"  eager up to {net.eager_limit()} B, rendezvous' first fragment up to {net.rendezvous_limit()} B "
              f"(ompi_info); extra one way: rendezvous {extra.get('rendezvous', 0.0) * 1e6:.1f} us, "
              f"pipeline {extra.get('pipeline', 0.0) * 1e6:.1f} us")
    print(f"{'bytes':>10}{'protocol':>11}{'StarPU-MPI us':>15}{'MPI us':>10}{'model us':>10}")
    for b, a, m in net.points:
        model = float(net.seconds(b)) + net.protocol_extra_s(b)
        print(f"{b:>10}{net.protocol(b):>11}{a * 1e6:>15.1f}{m * 1e6:>10.1f}{model * 1e6:>10.1f}")
    if probe:
        print(f"probe step ({probe['model']}, {probe['distribution']}, tiling {probe['tile']}): measured "
              f"{probe['step_s'] * 1e3:.1f} ms (runs {', '.join(f'{x * 1e3:.0f}' for x in probe['runs_s'])}), "
              f"{probe['predicted_with_pingpong_s'] * 1e3:.1f} ms predicted with the ping-pong's cost per message "
              f"and {probe['background_threads']:.1f} threads of other work")
        print(f"  cost per message to match   {probe['message_s_fitted'] * 1e6:10.1f} us (a check, not stored: "
              f"the forecast uses the ping-pong's {probe['message_s_pingpong'] * 1e6:.1f} us)")
        print(f"  submission per task         {net.submit_task_s * 1e6:10.1f} us (each rank's main thread, "
              f"starpu_mpi_task_insert, measured on the probe)")
        print(f"  of which CPU                {net.submit_cpu_task_s * 1e6:10.1f} us (time.thread_time)")
        if net.submit_roles:
            r = net.submit_roles
            print(f"  CPU per task by role        {r['exec'] * 1e6:.2f} us run here, {r['other'] * 1e6:.2f} us run "
                  f"elsewhere, {r['send'] * 1e6:.2f} us per send, {r['recv'] * 1e6:.2f} us per receive posted, "
                  f"{r.get('drop', 0.0) * 1e6:.2f} us per reader of a received copy dropped, "
                  f"{r.get('deps', 0.0) * 1e6:.2f} us per implicit dependency of a task run here (each insertion "
                  f"timed)")
        if net.submit_share:
            print(f"  main thread's share          {net.submit_share:.2f} of its rank's CPU while it submits "
                  f"(the scheduler's per-thread counts; 0.50 is an even split)")
        if net.progress_task_s is not None:
            print(f"  worker's gap per task       {probe['task_gap_mean_s'] * 1e6:10.2f} us (the probe's traces, after "
                  f"the submission), {net.progress_task_s * 1e6:.2f} us over the one-process "
                  f"{probe['flat_task_overhead_s'] * 1e6:.2f} us: StarPU-MPI's progress round per task")
        calls = probe.get("message_cpu_calls")
        if net.message_cpu_s is not None and calls:
            print(f"  progress CPU per message    {net.message_cpu_s * 1e6:10.2f} us on each side (its MPI calls timed "
                  f"in {calls['runs']} more runs: {calls['send_side_s'] * 1e6:.2f} us sending, "
                  f"{calls['recv_side_s'] * 1e6:.2f} us receiving; {calls['gaps']} gaps fitted)")
        elif net.message_cpu_s is not None:
            print(f"  progress CPU per message    {net.message_cpu_s * 1e6:10.2f} us on each side (the gaps after a "
                  f"send and before a receive's reader)")
    print(f"stored in {path}")
    return 0
