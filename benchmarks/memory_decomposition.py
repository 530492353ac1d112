"""Where a memory-limited step's forecast goes: per worker, kernels, StarPU's time, waits for the disk, idle; and
the device's time under the page cache (reads, write-back).

Forecasts one configuration as ``tilecast simulate --memory-limit`` does (the local machine's stored kernel
calibration and host costs; the disk node ``--disk`` or the stored one) and splits each worker's makespan into

- ``kernels_s``: its tasks' durations (end less start);
- ``starpu_s``: StarPU's time charged before its tasks (``DiskNode.worker_costs``: per task, per tile allocated,
  read back, written back, evicted clean);
- ``disk_wait_s``: what its tasks waited for their disk transfers (reads back, write-backs of victims), beyond
  StarPU's time;
- ``io_cpu_s``: its share of the disk traffic's computing time, paid before its tasks (``DiskNode.io_cpu_*``:
  the page cache's work on the workers' cores);
- ``other_s``: the rest (idle: no task ready for it; the scheduler's and the runtime's costs between tasks).

and the disk node's timeline into transfers through the page cache and the device's own time (reads that miss the
cache; the bytes written back by the flusher), with the wall time during which at least one writer waited for
write-back (the writers' waits overlap: their sum is no time of the step) and the writes that waited, with their
mean wait.
``--cache-gib``, ``--device-gbps WRITE,READ`` and ``--writeback-gbps`` fix the page cache and the device (the page cache is otherwise
what this machine's ``MemAvailable`` leaves now, which moves with the other processes).

Last line: one JSON object.

    python3 benchmarks/memory_decomposition.py --model gpt2-xl --batch 1 --seq 256 --tile 256 --memory-limit 12GiB \\
        --offload-dir /scratch/tc --cache-gib 10.3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace

import numpy as np


def decompose(res, disk) -> dict:
    """The split described in the module's docstring, from a memory-limited :class:`SimResult` (``keep_result``)."""
    s = res.summary
    makespan = float(s["makespan_s"])
    workers = []
    for w in np.unique(res.worker):
        mine = res.worker == w
        kernels = float((res.end[mine] - res.start[mine]).sum())
        starpu = float(res.task_costs[mine].sum())
        wait = float(res.task_waits[mine].sum())
        io = float(res.task_io[mine].sum())
        workers.append({"worker": int(w), "tasks": int(mine.sum()), "kernels_s": kernels, "starpu_s": starpu,
                        "disk_wait_s": wait, "io_cpu_s": io, "other_s": makespan - kernels - starpu - wait - io})
    out = {"makespan_s": makespan, "workers": workers, "disk_written_bytes": s["disk_written_bytes"], "disk_read_bytes": s["disk_read_bytes"],
           "disk_reads": s["disk_reads"], "disk_writes": s["disk_writes"]}
    if "page_cache" in s:
        misses, miss_bytes = s["page_cache_read_misses"], s["page_cache_miss_bytes"]
        out.update({
            "page_cache": s["page_cache"], "read_misses": misses, "read_hits": s["page_cache_read_hits"],
            "device_read_s": misses * disk.device_read_latency + miss_bytes / disk.device_read_bandwidth,
            "device_writeback_s": s["page_cache_written_back_bytes"] / disk.flusher_bandwidth,
            "written_back_bytes": s["page_cache_written_back_bytes"],
            # the writers' waits overlap (each worker's write-back waits in turn): their sum is no time of the
            # step; the wall time during which at least one writer waited is, and each wait's mean
            "writers_throttled_wall_s": s["page_cache_throttled_wall_s"],
            "throttled_writes": s["page_cache_throttled_writes"],
            "throttled_mean_ms": (1e3 * s["page_cache_throttled_s"] / s["page_cache_throttled_writes"]
                                  if s["page_cache_throttled_writes"] else 0.0)})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2-xl")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--tile", default="256")
    ap.add_argument("--memory-limit", default="12GiB", metavar="SIZE")
    ap.add_argument("--offload-dir", default=None, metavar="DIR", help="the disk node's directory (its stored figures)")
    ap.add_argument("--disk", default=None, metavar="FILE", help="a disk node file instead of the stored one")
    ap.add_argument("--sched", default="dmda")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cache-gib", type=float, default=0.0, help="the page cache the run leaves, GiB")
    ap.add_argument("--device-gbps", default="", metavar="WRITE,READ", help="the device's bandwidth, GB/s")
    ap.add_argument("--writeback-gbps", type=float, default=0.0,
                    help="the flusher's sustained write-back rate, GB/s (benchmarks/disk_contention.py)")
    args = ap.parse_args()
    from tilecast.executor.memory_limit import MemoryLimitError, parse_size

    try:
        limit = parse_size(args.memory_limit)
    except (MemoryLimitError, ValueError) as e:
        print(f"memory_decomposition: --memory-limit: {e}", file=sys.stderr)
        return 2
    device = None
    if args.device_gbps:
        try:
            device = [float(x) * 1e9 for x in args.device_gbps.split(",")]
            assert len(device) == 2 and min(device) > 0
        except (ValueError, AssertionError):
            print(f"memory_decomposition: --device-gbps: {args.device_gbps!r} is not WRITE,READ in GB/s",
                  file=sys.stderr)
            return 2
    if args.disk and not os.path.isfile(args.disk):
        print(f"memory_decomposition: --disk: no such file {args.disk}", file=sys.stderr)
        return 2
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model
    from tilecast.loop.config import StepConfig
    from tilecast.loop.predict import predict, stored_models
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.disk_node import ensure_disk, load_disk
    from tilecast.perfmodel.local import run_conditions
    from tilecast.perfmodel.page_cache import page_cache_for, run_process_bytes
    from tilecast.simulator.memory_capacity import MemoryForecast

    machine = load_machine("local")
    calibration, host_costs = stored_models(machine)
    disk = load_disk(args.disk) if args.disk else ensure_disk(machine, args.offload_dir)
    if device:
        disk = replace(disk, device_write_bandwidth=device[0], device_read_bandwidth=device[1])
    if args.writeback_gbps > 0:
        disk = replace(disk, device_writeback_bandwidth=args.writeback_gbps * 1e9,
                       device_writeback_source="given: --writeback-gbps")
    config = StepConfig(load_model(args.model), args.batch, args.seq, Tiling.parse(args.tile), args.sched,
                        args.workers)
    graph = config.build()
    cache = None
    if args.cache_gib:
        proc = run_process_bytes(limit, graph.n_tiles)
        cache = page_cache_for(proc, available_bytes=int(args.cache_gib * 2**30) + proc)
    t0 = time.perf_counter()
    p = predict(config, machine, calibration, host_costs, graph=graph, keep_result=True,
                memory=MemoryForecast(limit, replace(disk, walk_s=0.0), cache))
    out = decompose(p.result, disk)
    out.update({"step_s": p.step_s, "simulated_in_s": time.perf_counter() - t0, "disk_node": disk.describe()})
    print(f"{args.model} {args.batch} x {args.seq}, tile {args.tile}, {args.sched} on {args.workers} workers, limit "
          f"{args.memory_limit}: forecast step {p.step_s:.2f} s (makespan {out['makespan_s']:.2f} s)")
    print(f"  disk node: {out['disk_node']}")
    for w in out["workers"]:
        print(f"  worker {w['worker']}: {w['tasks']} tasks, kernels {w['kernels_s']:.2f} s, StarPU's time "
              f"{w['starpu_s']:.2f} s, waiting for the disk {w['disk_wait_s']:.2f} s, the disk traffic's computing "
              f"{w['io_cpu_s']:.2f} s, other {w['other_s']:.2f} s")
    print(f"  disk: {out['disk_written_bytes'] / 2**30:.2f} GiB written "
          f"({out['disk_writes']} tiles), {out['disk_read_bytes'] / 2**30:.2f} GiB read ({out['disk_reads']} tiles)")
    if "page_cache" in out:
        print(f"  {out['page_cache']}: {out['read_misses']} reads from the device ({out['device_read_s']:.2f} s of "
              f"the device), {out['written_back_bytes'] / 2**30:.2f} GiB written back ({out['device_writeback_s']:.2f}"
              f" s of the device)")
        print(f"  writers waited for write-back during {out['writers_throttled_wall_s']:.2f} s of the "
              f"{out['makespan_s']:.2f} s makespan: {out['throttled_writes']} writes waited, "
              f"{out['throttled_mean_ms']:.1f} ms each on average")
    print(json.dumps({**out, "conditions": run_conditions(), "load_after": os.getloadavg()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
