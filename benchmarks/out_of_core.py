"""Training steps of a model larger than the memory StarPU is allowed, with tiles evicted to disk.

Every tile is StarPU-managed; StarPU may use ``--memory-limit`` of main memory
for them and writes the others back to a disk node in ``--offload-dir``
(docs/memory.md). The initial parameters are loaded one tensor at a time, so
the process never holds the whole model in numpy. After ``--warmup`` steps,
``--steps`` steps are timed; for each the script prints the step time, the
bytes StarPU wrote to and read from the disk node (its bus counters), and at
the end the process's peak resident set size, which should stay within the
limit plus the process's own overhead: its resident set before StarPU starts
(Python, numpy, the kernels), StarPU's start, and StarPU's record of every
registered tile (``tilecast.executor.memory_limit.overhead_bytes``, printed
beside the measured overhead).

Before the run it prints the forecast of a step (``tilecast simulate
--memory-limit``: main memory capped at the limit, StarPU's eviction to the
disk node, whose speed ``tilecast calibrate`` measured in the offload
directory or is measured now; the local machine's stored kernel calibration
and host costs), and after it the measured figures beside it. The forecast runs in a child
process, so that the simulator's memory is not part of the measured peak.

Last line: one JSON object with ``step_s`` (median measured step, seconds),
``predicted_step_s`` (the forecast, seconds), ``disk_bytes`` (median per step:
``written``, ``read``, bytes), ``predicted_disk_bytes`` (``written``,
``read``, bytes per step), ``predicted_evictions``, ``predicted_writebacks`` and
``predicted_disk_transfers``, ``predicted_disk_writes``, ``predicted_disk_reads`` (tiles per step) and
``predicted_resident_per_transfer`` (tiles main memory holds, mean over the disk transfers),
``predicted_page_cache`` (the page cache in front of the device, where ``calibrate`` measured the device: its
figures, reads from it and from the device, seconds during which writers waited for write-back), ``peak_rss_bytes``, ``memory_limit_bytes``, ``overhead_bytes``
(peak RSS less the limit), ``expected_overhead_bytes`` (the formula's), ``rss_before_start_bytes``, ``tiles``,
the per-step lists, ``system_per_step`` (what the machine did during each timed step: the offload device's bytes
and busy share, the processors' split, this process's processor time and pages first touched, the dirty bytes;
``benchmarks/system_counters.py``) and the run conditions.

    python3 benchmarks/out_of_core.py                      # gpt2-xl, batch 1 x 256, 12GiB, 3 steps
    python3 benchmarks/out_of_core.py --model gpt2-tiny --batch 8 --seq 128 --tile 32 --memory-limit 2MiB
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from tilecast.executor.memory_limit import (HANDLE_BYTES, STARPU_START_BYTES, MemoryLimit, MemoryLimitError,
                                            current_rss_bytes, format_size, overhead_bytes, parse_size)
from tilecast.executor.starpu_run import run_steps
from tilecast.graph import Tiling
from tilecast.graph.model_config import load_model
from tilecast.loop.predict_memory import predicted_fields_apart
from tilecast.simulator.engine import SimulationError
from tilecast.perfmodel.local import conditions_line, run_conditions
from tilecast.perfmodel.page_cache import page_cache_for, run_process_bytes

from offload_dir import offload_directory
from system_counters import StepCounters


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2-xl")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--tile", default="256")
    ap.add_argument("--memory-limit", default="12GiB", metavar="SIZE")
    ap.add_argument("--offload-dir", default=None, metavar="DIR",
                    help="disk node directory (default: a new directory under $TILECAST_HOME/offload, removed "
                         "at the end)")
    ap.add_argument("--offload-io", default="buffered", choices=["buffered", "direct"],
                    help="the disk node's files through the page cache (buffered, default) or with O_DIRECT for "
                         "the tiles of whole pages (direct); docs/memory.md")
    ap.add_argument("--sched", default="dmda")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first (default: 1)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps after the warm-up (default: 3)")
    ap.add_argument("--recompute", default="none", choices=["none", "selective", "full"],
                    help="activation recompute of the step (default: none)")
    args = ap.parse_args()
    cfg = load_model(args.model)
    with offload_directory(args.offload_dir, "run-") as offload:
        try:
            memory = MemoryLimit(parse_size(args.memory_limit), offload, args.offload_io)
            conditions = run_conditions()
            print(conditions_line(conditions))
            print(f"{cfg.name}, batch {args.batch} x {args.seq}, tile {args.tile}, {args.sched} on {args.workers} "
                  f"workers; memory limit {format_size(memory.limit_bytes)}, offload to {offload} ({memory.offload_io})")

            t0 = time.perf_counter()
            try:
                forecast = predicted_fields_apart(cfg, args.batch, args.seq, Tiling.parse(args.tile), args.sched,
                                                  args.workers, memory.limit_bytes, offload, args.recompute,
                                                  offload_io=args.offload_io)
            except SimulationError as e:
                print(f"out_of_core: {e}", file=sys.stderr)
                return 2
            print(f"predicted step {forecast['step_s']:.2f} s (simulated in {time.perf_counter() - t0:.1f} s): "
                  f"{format_size(forecast['disk_written_bytes'])} written to disk, "
                  f"{format_size(forecast['disk_read_bytes'])} read, {forecast['evictions']} evictions "
                  f"({forecast['writebacks']} write-backs)", flush=True)
            if forecast.get("page_cache"):
                print(f"  through the {forecast['page_cache']}: {forecast['page_cache_read_misses']} of "
                      f"{forecast['page_cache_read_misses'] + forecast['page_cache_read_hits']} reads from the device, "
                      f"writers waited for write-back during {forecast['page_cache_throttled_wall_s']:.1f} s "
                      f"({forecast['page_cache_throttled_writes']} writes)", flush=True)

            counters = StepCounters(offload, page_cache_for(run_process_bytes(memory.limit_bytes, 0)).background_bytes)

            def progress(t, dt, loss):
                counters.mark()
                print(f"  step {t + 1}: {dt:.2f} s, loss {loss:.4f}", file=sys.stderr, flush=True)

            # pandas, which the run imports (its trace table), loaded before the baseline: its pages are part of
            # what the process holds before StarPU starts (the prediction path, which loaded it first, no longer does)
            import pandas  # noqa: F401

            before_start = current_rss_bytes()
            counters.start()
            try:
                res = run_steps(cfg, args.batch, args.seq, Tiling.parse(args.tile), args.sched, args.workers,
                                args.warmup + args.steps, seed=0, progress=progress, memory=memory,
                                recompute=args.recompute)
            finally:
                counters.stop()
        except MemoryLimitError as e:
            print(f"out_of_core: {e}", file=sys.stderr)
            return 2
    timed = slice(args.warmup, None)
    steps, written, read = res.step_s[timed], res.disk_written[timed], res.disk_read[timed]
    print(f"\n{'step':>5}{'time s':>10}{'disk written':>15}{'disk read':>15}{'loss':>9}")
    for k, (dt, w, r, loss) in enumerate(zip(steps, written, read, res.losses[timed])):
        print(f"{args.warmup + k + 1:>5}{dt:>10.2f}{format_size(w):>15}{format_size(r):>15}{loss:>9.4f}")
    system = counters.steps()[timed]
    print(f"\nthe machine during each timed step (device {system[0]['device'] if system else None}; processors: all "
          f"processes):")
    for k, c in enumerate(system):
        dirty = c["dirty_over_background_share"]
        print(f"  step {args.warmup + k + 1}: device wrote {c['device_written_bytes'] / c['seconds'] / 1e9:.3f} GB/s, "
              f"read {c['device_read_bytes'] / c['seconds'] / 1e9:.3f} GB/s, busy {100 * c['device_busy']:.0f}%; "
              f"processors {100 * c['cpu_user']:.0f}% user, {100 * c['cpu_system']:.0f}% system, "
              f"{100 * c['cpu_idle']:.0f}% idle, {100 * c['cpu_iowait']:.0f}% I/O wait, {100 * c['cpu_steal']:.0f}% "
              f"steal; this process "
              f"{c['process_user_s']:.1f} s user + {c['process_system_s']:.1f} s system (the workers' own threads "
              f"{c['workers_cpu_s']:.1f} s, waiting for a core {c['workers_waiting_for_a_core_s']:.1f} s; its other "
              f"threads {c['process_other_cpu_s']:.1f} s; outside it "
              f"{c['outside_process_cpu_s']:.1f} s; {c['process_minor_faults']} pages first touched); "
              f"page cache reclaimed {format_size(c['reclaimed_bytes'])}; "
              f"dirty at most "
              f"{format_size(c['dirty_max_bytes'])}"
              + (f", past the background threshold {100 * dirty:.0f}% of the step" if dirty is not None else ""))
    step_s = float(np.median(steps))
    err = (forecast["step_s"] - step_s) / step_s
    # StarPU's CPU workers poll while they wait for their tiles (1.3.10, src/drivers/cpu/driver_cpu.c,
    # _starpu_cpu_driver_run_once), so a step keeps its workers' cores busy throughout: on a machine shared with
    # other work, the processor time the process got per step is the figure to set beside workers x the forecast
    cpu_s = float(np.median([c["process_user_s"] + c["process_system_s"] for c in system])) if system else 0.0
    print(f"this process's processor time per timed step (median) {cpu_s:.1f} s; the forecast's {args.workers} "
          f"workers x {forecast['step_s']:.2f} s = {args.workers * forecast['step_s']:.1f} s")
    print(f"\nmedian step {step_s:.2f} s ({res.n_tasks} tasks); predicted {forecast['step_s']:.2f} s "
          f"({100 * err:+.0f}%)")
    print(f"disk per step (median): {format_size(np.median(written))} written, {format_size(np.median(read))} read; "
          f"predicted {format_size(forecast['disk_written_bytes'])} written, "
          f"{format_size(forecast['disk_read_bytes'])} read")
    over = res.peak_rss_bytes - memory.limit_bytes
    tiles = res.graph.n_tiles
    expected = overhead_bytes(res.graph, before_start, memory.limit_bytes)
    print(f"peak RSS {format_size(res.peak_rss_bytes)} = limit {format_size(memory.limit_bytes)} "
          f"{'+' if over >= 0 else '-'} {format_size(abs(over))}; expected overhead {format_size(expected)} = "
          f"{format_size(before_start)} before StarPU + {format_size(STARPU_START_BYTES)} StarPU's start + "
          f"{tiles} tiles x {HANDLE_BYTES} B StarPU's handles ({format_size(tiles * HANDLE_BYTES)}) + a page "
          f"per mapped tile buffer in memory")
    print(json.dumps({
        "model": cfg.name, "batch": args.batch, "seq": args.seq, "tiling": args.tile, "sched": args.sched,
        "workers": args.workers, "tasks": res.n_tasks, "memory_limit_bytes": memory.limit_bytes,
        "recompute": args.recompute, "offload_io": args.offload_io, "step_s": step_s,
        "predicted_step_s": forecast["step_s"],
        "disk_bytes": {"written": float(np.median(written)), "read": float(np.median(read))},
        "predicted_disk_bytes": {"written": forecast["disk_written_bytes"], "read": forecast["disk_read_bytes"]},
        "predicted_evictions": forecast["evictions"], "predicted_writebacks": forecast["writebacks"],
        "predicted_disk_transfers": forecast["disk_transfers"], 
        "predicted_disk_writes": forecast["disk_writes"], "predicted_disk_reads": forecast["disk_reads"],
        "predicted_resident_per_transfer": forecast["resident_per_transfer"],
        "predicted_page_cache": {k: forecast[k] for k in ("page_cache", "page_cache_read_hits",
                                                          "page_cache_read_misses", "page_cache_throttled_wall_s",
                                                          "page_cache_throttled_writes")},
        "peak_rss_bytes": res.peak_rss_bytes, "overhead_bytes": over, "expected_overhead_bytes": expected,
        "rss_before_start_bytes": before_start, "tiles": tiles, "step_times_s": steps, "disk_written_bytes": written,
        "disk_read_bytes": read, "losses": res.losses, "conditions": conditions, "system_per_step": system,
        "process_cpu_s_per_step": cpu_s,
        "load_after": os.getloadavg(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
