"""StarPU's memory-chunk list walks in a memory-limited step, counted inside StarPU, beside the simulator's.

Under ``--memory-limit`` every allocation in main memory that finds no room
walks StarPU's list of the tiles main memory holds, looking for a clean tile
of the same size to reuse (``memalloc.c``, ``try_to_reuse_potentially_in_use_mc``)
and else for tiles to evict (``free_potentially_in_use_mc``), and tidying
(``starpu_memchunk_tidy``) walks it to write dirty tiles back ahead of need.
The simulator walks its own copy of that list the same way
(:class:`tilecast.simulator.memory_capacity.CappedMemory`). This benchmark
runs the step on StarPU 1.3.10 built with counters on those walks
(``benchmarks/starpu_walk_build.py``; the first run builds it from Debian's
source package, ``--source`` or ``$TILECAST_STARPU_SRC``: about 5 minutes),
loaded in place of Debian's by ``LD_LIBRARY_PATH`` in a child process, and
prints per timed step what the walks did and took there, beside the
simulator's walks for the same configuration (its forecast of a step after a
warm-up step, from the stored models as ``benchmarks/out_of_core.py`` makes
it).

What it answers: how long StarPU's walks are (tiles walked per search, and why
the tiles of the wanted size were passed over: in use, dirty and flagged clean
by tidying with the write-back not done, dirty and not flagged, before or
past the tile tidying looks at next), how much of
the workers' time they take (seconds summed over the workers, nanoseconds per
tile walked), and whether the simulator's walks are as long and as many.

Last line: one JSON object with ``step_s`` (median measured step),
``predicted_step_s``, ``starpu`` (medians per timed step of every counter of
:data:`starpu_walk_build.COUNTERS`, seconds for the ``_ns`` ones, plus
``reuse_walked_per_search`` and ``ns_per_tile_walked``), ``simulated``
(``reuse_searches``, ``reuse_walked``, ``reuse_walked_per_search``,
``tidy_passes``, ``tidy_walked``), the per-step lists and the run conditions.

    python3 benchmarks/starpu_walk.py --source ~/starpu-1.3.10+dfsg            # gpt2-medium, 2 GiB, 2 workers
    python3 benchmarks/starpu_walk.py --model gpt2-xl --memory-limit 12GiB     # about 10 minutes
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from starpu_walk_build import COUNTERS, N_SLOTS, BuildError, ensure_starpu_walk
from tilecast.executor.memory_limit import MemoryLimit, MemoryLimitError, format_size, parse_size
from tilecast.graph import Tiling
from tilecast.graph.model_config import load_model
from tilecast.kernels.native_build import NativeUnavailable
from tilecast.perfmodel.local import conditions_line, run_conditions

from offload_dir import offload_directory  # benchmarks/, beside this script


def _args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2-medium")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--tile", default="256")
    ap.add_argument("--memory-limit", default="2GiB", metavar="SIZE")
    ap.add_argument("--offload-dir", default=None, metavar="DIR",
                    help="disk node directory (default: a new directory under $TILECAST_HOME/offload, removed "
                         "at the end)")
    ap.add_argument("--sched", default="dmda")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first (default: 1)")
    ap.add_argument("--steps", type=int, default=2, help="timed steps after the warm-up (default: 2)")
    ap.add_argument("--source", default=None, metavar="DIR",
                    help="StarPU 1.3.10's unpacked source package (apt-get source starpu), to build the "
                         "instrumented library from the first time (default: $TILECAST_STARPU_SRC)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def _counters(lib) -> np.ndarray:
    buf = (ctypes.c_ulonglong * N_SLOTS)()
    lib.tcw_walk_counters(buf, N_SLOTS)
    return np.array(buf[:], dtype=np.uint64)


def _loaded_starpu() -> str:
    """The path of the libstarpu this process loaded (from /proc/self/maps)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        if "libstarpu-1.3.so" in line:
            return line.split()[-1]
    return ""


def child(args) -> int:
    """Run the steps on the StarPU that LD_LIBRARY_PATH puts first; one JSON line of counters per step."""
    from tilecast.executor.starpu_run import run_steps

    memory = MemoryLimit(parse_size(args.memory_limit), args.offload_dir)
    state = {"lib": None, "prev": None}

    def progress(t, dt, loss):
        if state["lib"] is None:
            path = _loaded_starpu()
            lib = ctypes.CDLL(path)
            if not hasattr(lib, "tcw_walk_counters"):
                raise SystemExit(f"starpu_walk: {path} has no walk counters (LD_LIBRARY_PATH did not put the "
                                 f"instrumented StarPU first)")
            state["lib"], state["prev"] = lib, np.zeros(N_SLOTS, np.uint64)
            print(json.dumps({"library": path}), flush=True)
        now = _counters(state["lib"])
        delta = (now - state["prev"]).astype(np.int64)
        state["prev"] = now
        print(json.dumps({"step": t + 1, "step_s": dt, "loss": loss,
                          **{k: int(v) for k, v in zip(COUNTERS, delta)}}), flush=True)

    run_steps(load_model(args.model), args.batch, args.seq, Tiling.parse(args.tile), args.sched, args.workers,
              args.warmup + args.steps, seed=0, progress=progress, memory=memory)
    return 0


def _simulated(args, limit_bytes: int, offload: str) -> dict:
    from tilecast.loop.predict_memory import predict_limited

    p = predict_limited(load_model(args.model), args.batch, args.seq, Tiling.parse(args.tile), args.sched,
                        args.workers, limit_bytes, offload)
    s = p.summary
    out = {k: int(s.get(k, 0)) for k in ("reuse_searches", "reuse_walked", "tidy_passes", "tidy_walked")}
    out["reuse_walked_per_search"] = out["reuse_walked"] / max(out["reuse_searches"], 1)
    out["step_s"] = p.step_s
    return out


def _per_step(row: dict) -> dict:
    """A step's counters with the derived figures (seconds, per search, per tile walked)."""
    out = {k: row[k] for k in COUNTERS}
    for k in COUNTERS:
        if k.endswith("_ns"):
            out[k[:-3] + "_s"] = out.pop(k) / 1e9
    n = max(row["reuse_calls"], 1)
    out["reuse_walked_per_search"] = row["reuse_walked"] / n
    out["held"] = row["held_sum"] / n
    out["ns_per_tile_walked"] = row["reuse_ns"] / max(row["reuse_walked"], 1)
    return out


def main(argv=None) -> int:
    args = _args(argv)
    if args.child:
        return child(args)
    try:
        limit = parse_size(args.memory_limit)
        cfg = load_model(args.model)
        lib_dir = ensure_starpu_walk(args.source)
    except (MemoryLimitError, BuildError, NativeUnavailable, ValueError) as e:
        # NativeUnavailable: no source tree, a tool missing, or a build step failed (with the log's last lines)
        print(f"starpu_walk: {e}", file=sys.stderr)
        return 2
    with offload_directory(args.offload_dir, "walk-") as offload:
        conditions = run_conditions()
        print(conditions_line(conditions))
        print(f"{cfg.name}, batch {args.batch} x {args.seq}, tile {args.tile}, {args.sched} on {args.workers} workers; "
              f"memory limit {format_size(limit)}, offload to {offload}; StarPU with walk counters from {lib_dir}",
              flush=True)
        sim = _simulated(args, limit, offload)
        print(f"forecast {sim['step_s']:.2f} s; the simulator's walks in its step: {sim['reuse_searches']} searches "
              f"for a tile to reuse, {sim['reuse_walked_per_search']:.0f} tiles walked per search; "
              f"{sim['tidy_passes']} tidying passes, {sim['tidy_walked']} tiles looked at", flush=True)
        env = dict(os.environ, LD_LIBRARY_PATH=f"{lib_dir}:{os.environ.get('LD_LIBRARY_PATH', '')}".rstrip(":"))
        cmd = [sys.executable, __file__, "--child", "--model", args.model, "--batch", str(args.batch), "--seq",
               str(args.seq), "--tile", args.tile, "--memory-limit", args.memory_limit, "--offload-dir", offload,
               "--sched", args.sched, "--workers", str(args.workers), "--warmup", str(args.warmup), "--steps",
               str(args.steps)]
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
        rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0:
            print(f"starpu_walk: the run failed (exit {proc.returncode})", file=sys.stderr)
            return proc.returncode or 1
    library = next((r["library"] for r in rows if "library" in r), "")
    steps = [r for r in rows if "step" in r][args.warmup:]
    per = [_per_step(r) for r in steps]
    print(f"\nlibstarpu loaded: {library}")
    print(f"{'step':>5}{'time s':>9}{'searches':>10}{'walked':>8}{'of size':>8}{'taken':>8}{'flagged':>8}{'walk s':>8}"
          f"{'ns/tile':>8}{'in use':>8}{'flagged':>8}{'dirty':>7}{'<head':>7}{'evict':>7}{'evict s':>8}{'alloc s':>8}"
          f"{'tidy':>6}{'tidy walked':>12}")
    for r, p in zip(steps, per):
        n = max(p["reuse_calls"], 1)
        print(f"{r['step']:>5}{r['step_s']:>9.2f}{p['reuse_calls']:>10}{p['reuse_walked_per_search']:>8.0f}"
              f"{p['reuse_matched'] / n:>8.0f}{p['reuse_taken']:>8}{p['taken_flagged']:>8}{p['reuse_s']:>8.2f}"
              f"{p['ns_per_tile_walked']:>8.0f}{p['matched_busy'] / n:>8.1f}{p['matched_owner_flagged'] / n:>8.1f}"
              f"{p['matched_owner_unflagged'] / n:>7.0f}{p['unflagged_before_dirty_head'] / n:>7.0f}"
              f"{p['evict_calls']:>7}{p['evict_s']:>8.2f}{p['alloc_s']:>8.2f}{p['tidy_passes']:>6}"
              f"{p['tidy_walked']:>12}")
    print("(taken, flagged: searches that took a tile, and of those the tiles tidying had flagged clean; "
          "walked, of size, in use, flagged, dirty, <head: per search; in use, flagged, dirty: tiles of the wanted "
          "size passed over, dirty ones flagged clean by tidying or not; <head: of the dirty ones not flagged, those "
          "before tidying's next tile; walk s, evict s, alloc s: summed over the workers)")
    print(f"{'sim':>5}{sim['step_s']:>9.2f}{sim['reuse_searches']:>10}{sim['reuse_walked_per_search']:>8.0f}"
          f"{'':>87}{sim['tidy_passes']:>6}{sim['tidy_walked']:>12}")
    step_s = float(np.median([r["step_s"] for r in steps])) if steps else float("nan")
    medians = {k: float(np.median([p[k] for p in per])) for k in per[0]} if per else {}
    print(json.dumps({
        "model": cfg.name, "batch": args.batch, "seq": args.seq, "tiling": args.tile, "sched": args.sched,
        "workers": args.workers, "memory_limit_bytes": limit, "library": library, "step_s": step_s,
        "predicted_step_s": sim["step_s"], "starpu": medians, "simulated": sim,
        "step_times_s": [r["step_s"] for r in steps], "per_step": per, "conditions": conditions,
        "load_after": os.getloadavg(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
