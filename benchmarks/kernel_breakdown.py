"""Where a training step's kernel time goes, kernel by kernel, on one thread; optionally against other C sources.

Builds the step's graph (default: GPT-2-small widths, n_embd 768, 12 heads,
vocabulary 50257, 12 layers, batch 4 x 256, tile 512, as in
``executor_vs_torch.py``; ``--family llama``: that benchmark's Llama of the
same width, 4 key/value heads, SwiGLU inner size 2048, untied head), groups its tasks by kernel and parameters, times
one task of each group on buffers of the graph's tile sizes (fastest of
``--repeats`` runs after one warm-up, in CPU time of the thread, single-threaded
BLAS) and
multiplies by the group's size: the kernels' busy time of one step on one
worker, without scheduling. "BLAS kernels" is the share of that time spent in
the kernels that are SGEMM calls (gemm and the attention products).

``--baseline REV`` also builds the C kernels of git revision ``REV`` and
times every group with both builds alternately, run by run, in the same
process, so that the load of other processes hits both alike; the ratio column is
baseline time / current time (above 1: faster now). A kernel that the
baseline lacks because it fuses older ones is timed there as those kernels
in turn (``PARTS``).

``--cold`` also times every group with its tiles evicted from the caches
before each run (256 MiB of other memory read first), run by run with the
warm timing: in a StarPU step a tile is mostly read long after it was
written, so this is closer to the rate a task gets there; ``cold s`` and
``cold/warm`` are the columns, ``cold_s`` and ``cold_ratio`` the JSON keys (with
``--baseline`` also the baseline's cold time and the speedup on cold tiles:
``cold_baseline_s``, ``cold_speedup``).

The peak that rates are set against is a 1024^3 SGEMM of the same BLAS timed
the same way (fastest of ``--repeats``), as ``executor_vs_torch.py`` sets a
step's rates against that GEMM per worker. Memory-bound kernels are set
against a copy of 256 MiB (beyond most caches) on the same thread: ``GB/s`` is
the registry's bytes (each buffer once per direction) over the kernel's time,
the copy's rate counts the bytes read and written.

Prints a table (seconds per step per kernel, share, rate, share of the peak,
ratio), with ``--shapes N`` the N task groups (kernel and parameters) that take
the most time, and, last, one JSON line: ``family`` (gpt2 or llama); ``kernels`` maps each kernel to
``tasks``, ``s`` (seconds of one step on one thread), ``gflops`` (the
registry's flops over that time, GFLOP/s), ``of_peak`` (gflops over
``peak_gflops``), ``gbs`` (the registry's bytes over that time, GB/s) and, with
a baseline, ``baseline_s`` and ``speedup``; ``kernels_s`` is the sum;
``peak_gflops`` the 1024^3 SGEMM's GFLOP/s; ``copy_gbs`` the copy's GB/s; with
``--shapes``, ``shapes`` lists those groups (``kernel``, ``params`` by name,
``tasks``, ``s``, ``gflops``, ``of_peak``).

    python3 benchmarks/kernel_breakdown.py [--family gpt2] [--layers 12] [--tile 512] [--baseline main] [--shapes 15] [--cold]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tilecast.graph import Tiling
from tilecast.graph.models import build_step
from tilecast.graph.model_config import load_model
from tilecast.kernels import all_kernels, blas
from tilecast.kernels.native import CDEF, COMPILE_ARGS, INT64_BUFFERS, library
from tilecast.kernels.native_build import build_extension
from tilecast.perfmodel.local import conditions_line, run_conditions

GEMM_KERNELS = {"gemm", "attn_qk", "attn_pv", "attn_ptv", "attn_qk_softmax"}
REPO = Path(__file__).resolve().parent.parent
# the widths of executor_vs_torch.py's rows
SHAPES = {"gpt2": dict(n_embd=768, n_head=12, vocab_size=50257, n_positions=1024),
          "llama": dict(family="llama", n_embd=768, n_head=12, n_kv_head=4, intermediate_size=2048,
                        vocab_size=50257, n_positions=1024)}


def baseline_library(rev: str):
    """The C kernels of git revision ``rev``, built under their own name."""
    listing = subprocess.run(["git", "-C", str(REPO), "ls-tree", "--name-only", f"{rev}:tilecast/kernels/c"],
                             check=False, capture_output=True, text=True)
    if listing.returncode != 0:
        sys.exit(f"kernel_breakdown: --baseline {rev}: no tilecast/kernels/c at that revision of {REPO}")
    flags = blas.build_flags()
    with tempfile.TemporaryDirectory(prefix="tilecast-c-") as tmp:  # the build is cached by content
        out = Path(tmp)
        for name in listing.stdout.split():
            blob = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:tilecast/kernels/c/{name}"], check=True,
                                  capture_output=True).stdout
            (out / name).write_bytes(blob)
        return build_extension(
            "_tilecast_kernels_baseline", CDEF, '#include "tilecast_kernels.h"',
            sources=sorted(str(p) for p in out.glob("*.c")), include_dirs=[str(out)] + flags["include_dirs"],
            libraries=flags["libraries"] + ["m"], library_dirs=flags["library_dirs"],
            extra_link_args=flags["extra_link_args"], extra_compile_args=COMPILE_ARGS)


def copy_rate(repeats: int, nbytes: int = 256 << 20) -> float:
    """Bytes read and written per second by a numpy copy of ``nbytes`` on this thread (fastest run, thread CPU
    time): what a memory-bound kernel that streams its tiles from memory can reach on one worker."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.zeros_like(src)
    best = np.inf
    for r in range(repeats + 1):
        t0 = time.thread_time()
        np.copyto(dst, src)
        t = time.thread_time() - t0
        if r:
            best = min(best, t)
    return 2.0 * nbytes / best


def task_groups(graph):
    """(kernel, first task, count) for each distinct (kernel, parameters) of the graph."""
    groups: dict = {}
    for i in range(graph.n_tasks):
        key = (int(graph.kernel[i]), graph.params[graph.param_ptr[i]:graph.param_ptr[i + 1]].tobytes())
        if key in groups:
            groups[key][1] += 1
        else:
            groups[key] = [i, 1]
    return [(k[0], first, n) for k, (first, n) in groups.items()]


def buffers(graph, task, rng, vocab):
    """Fresh buffers of the task's tile sizes: floats in [0.1, 1), token ids below ``vocab``, per-row statistics
    (max or mean, then sum or M2) of 0.5 and 300."""
    k = all_kernels()[int(graph.kernel[task])]
    a, b = graph.acc_ptr[task], graph.acc_ptr[task + 1]
    out = []
    for name, tile in zip(k.buffers, graph.acc_tile[a:b]):
        nbytes = int(graph.tile_nbytes[tile])
        if name in INT64_BUFFERS:
            out.append(rng.integers(0, vocab, nbytes // 8).astype(np.int64))
        elif name == "stats" and nbytes % 8 == 0:
            out.append(np.tile(np.float32([0.5, 300.0]), nbytes // 8))
        else:
            out.append(rng.uniform(0.1, 1.0, nbytes // 4).astype(np.float32))
    return out


def timer(mod):
    """A function timing one run of a kernel of ``mod``: CPU seconds of the calling thread, so that time spent
    preempted by other processes does not count (BLAS runs on this thread: one BLAS thread)."""
    def time_once(kernel_name, params, bufs):
        fn = mod.lib.tc_kernel_lookup(kernel_name.encode())
        p = mod.ffi.from_buffer("double[]", np.ascontiguousarray(params, dtype=np.float64))
        ptrs = mod.ffi.new("void *[]", len(bufs))
        for j, buf in enumerate(bufs):
            ptrs[j] = mod.ffi.cast("void *", buf.ctypes.data)
        t0 = time.thread_time()
        mod.lib.tc_run(fn, p, ptrs)
        return time.thread_time() - t0
    return time_once


def cold_timer(time_once, nbytes: int = 256 << 20):
    """Like ``time_once``, but first reads ``nbytes`` of other memory, so that the task's tiles come from
    memory rather than the caches, as in a step where a tile was written long before it is read."""
    other = np.ones(nbytes // 4, dtype=np.float32)

    def run(kernel_name, params, bufs):
        float(other[::16].sum())  # one float per 64-byte line: every line of ``other`` is read
        return time_once(kernel_name, params, bufs)
    return run


def qk_softmax_parts(params, bufs):
    """attn_qk_softmax as the three tasks it replaces (for a baseline without it)."""
    bt, ht, sq, sk = params[:4]
    q, k, s, st = bufs
    rows = bt * ht * sq
    return [("attn_qk", params, [q, k, s]), ("softmax_stats", [rows, sk, 0.0], [s, st]),
            ("softmax_apply", [rows, sk], [st, s])]


# Kernels a baseline may lack, and the tasks they replace.
PARTS = {"attn_qk_softmax": qk_softmax_parts}


def timer_with_parts(mod):
    """Like :func:`timer`, timing a kernel that ``mod`` lacks as the tasks it replaces (:data:`PARTS`)."""
    time_once = timer(mod)

    def run(kernel_name, params, bufs):
        if kernel_name in PARTS and mod.lib.tc_kernel_lookup(kernel_name.encode()) == mod.ffi.NULL:
            return sum(time_once(*part) for part in PARTS[kernel_name](params, bufs))
        return time_once(kernel_name, params, bufs)
    return run


def fastest(timers: dict, kernel_name, params, bufs, repeats: int) -> dict:
    """Fastest of ``repeats`` runs of each build after a warm-up, the builds taking turns run by run.

    Every run starts from the same buffer contents (in-place kernels would otherwise drift to other values).
    """
    work = {which: [b.copy() for b in bufs] for which in timers}
    best = {which: np.inf for which in timers}
    for r in range(repeats + 1):
        for which, time_once in timers.items():
            for w, b in zip(work[which], bufs):
                np.copyto(w, b)
            t = time_once(kernel_name, params, work[which])
            if r:
                best[which] = min(best[which], t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=sorted(SHAPES), default="gpt2",
                    help="model family at GPT-2 small's width (default: gpt2)")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--tile", default="512")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per task group (default 5)")
    ap.add_argument("--baseline", metavar="REV", help="git revision whose C kernels to time side by side")
    ap.add_argument("--kernels", type=lambda v: set(v.split(",")), default=None,
                    help="time only these kernels (comma-separated names)")
    ap.add_argument("--shapes", type=int, default=0, metavar="N",
                    help="also list the N task groups (kernel and parameters) that take the most time")
    ap.add_argument("--cold", action="store_true",
                    help="also time every group with its tiles evicted from the caches first")
    args = ap.parse_args()
    if args.shapes < 0:
        ap.error(f"--shapes: a count of groups, 0 or more, got {args.shapes}")
    unknown = sorted((args.kernels or set()) - {k.name for k in all_kernels()})
    if unknown:
        ap.error(f"--kernels: unknown kernel(s) {', '.join(unknown)}")
    conditions = run_conditions()
    print(conditions_line(conditions))
    cfg = load_model(json.dumps(dict(n_layer=args.layers, **SHAPES[args.family])))
    graph = build_step(cfg, args.batch, args.seq, Tiling.parse(args.tile))
    timers = {"now": timer(library())}
    n = 1024
    peak_bufs = [np.random.default_rng(1).uniform(0.1, 1.0, n * n).astype(np.float32) for _ in range(3)]
    peak = 2.0 * n**3 / fastest({"now": timers["now"]}, "gemm", [0, 0, n, n, n, 1.0, 0.0], peak_bufs,
                                args.repeats)["now"]
    copy = copy_rate(args.repeats)
    if args.baseline:
        timers["base"] = timer_with_parts(baseline_library(args.baseline))
    if args.cold:
        timers["cold"] = cold_timer(timers["now"])
        if args.baseline:
            timers["cold_base"] = cold_timer(timers["base"])
    rng = np.random.default_rng(0)
    kernels = all_kernels()
    total = {name: {} for name in timers}
    tasks: dict = {}
    flops = {kernels[kid].name: float(graph.flops[graph.kernel == kid].sum()) for kid in np.unique(graph.kernel)}
    groups, moved = [], {}
    for kid, first, count in task_groups(graph):
        k = kernels[kid]
        params = graph.params[graph.param_ptr[first]:graph.param_ptr[first + 1]]
        if args.kernels and k.name not in args.kernels:
            continue
        bufs = buffers(graph, first, rng, cfg.vocab_size)
        a, b = graph.acc_ptr[first], graph.acc_ptr[first + 1]
        moved[k.name] = moved.get(k.name, 0.0) + count * float(k.bytes(graph.tile_nbytes[graph.acc_tile[a:b]])[0])
        for which, t in fastest(timers, k.name, params, bufs, args.repeats).items():
            total[which][k.name] = total[which].get(k.name, 0.0) + count * t
            if which == "now":
                groups.append(dict(kernel=k.name, params=dict(zip(k.params, params.tolist())), tasks=count,
                                   s=count * t, gflops=count * float(graph.flops[first]) / (count * t) / 1e9))
        tasks[k.name] = tasks.get(k.name, 0) + count
    now = total["now"]
    all_s = sum(now.values())
    gemm_s = sum(v for name, v in now.items() if name in GEMM_KERNELS)
    all_s = max(all_s, 1e-30)
    print(f"{'Llama' if args.family == 'llama' else 'GPT-2'} width, {args.layers} layers, batch {args.batch} x {args.seq}, tiling {graph.meta['tiling']}: "
          f"{graph.n_tasks} tasks, one thread; peak (1024^3 SGEMM, same BLAS, same timer) {peak / 1e9:.1f} GFLOP/s, "
          f"copy of 256 MiB {copy / 1e9:.1f} GB/s")
    head = f"{'kernel':<15}{'tasks':>7}{'s/step':>10}{'share':>8}{'GFLOP/s':>9}{'of peak':>8}{'GB/s':>7}"
    print(head + (f"{'base s':>10}{'speedup':>9}" if args.baseline else "")
          + (f"{'cold s':>9}{'cold/warm':>10}" if args.cold else "")
          + (f"{'cold base':>10}{'speedup':>9}" if args.cold and args.baseline else ""))
    rows = {}
    for name in sorted(now, key=now.get, reverse=True):
        row = dict(tasks=tasks[name], s=now[name], gflops=flops[name] / now[name] / 1e9)
        row["of_peak"] = row["gflops"] * 1e9 / peak
        row["gbs"] = moved[name] / now[name] / 1e9
        line = (f"{name:<15}{tasks[name]:>7}{now[name]:>10.4f}{now[name] / all_s:>8.1%}{row['gflops']:>9.1f}"
                f"{row['of_peak']:>8.0%}{row['gbs']:>7.1f}")
        if args.baseline:
            base = total["base"][name]
            row.update(baseline_s=base, speedup=base / now[name])
            line += f"{base:>10.4f}{base / now[name]:>8.2f}x"
        if args.cold:
            cold = total["cold"][name]
            row.update(cold_s=cold, cold_ratio=cold / now[name])
            line += f"{cold:>9.4f}{cold / now[name]:>9.2f}x"
            if args.baseline:
                cold_base = total["cold_base"][name]
                row.update(cold_baseline_s=cold_base, cold_speedup=cold_base / cold)
                line += f"{cold_base:>10.4f}{cold_base / cold:>8.2f}x"
        rows[name] = row
        print(line)
    result = dict(family=args.family, layers=args.layers, batch=args.batch, seq=args.seq, tiling=graph.meta["tiling"],
                  tasks=graph.n_tasks, kernels_s=all_s, blas_time_share=gemm_s / all_s, kernels=rows,
                  peak_gflops=peak / 1e9, copy_gbs=copy / 1e9, conditions=conditions)
    if args.shapes:
        top = sorted(groups, key=lambda g: g["s"], reverse=True)[:args.shapes]
        for g in top:
            g["of_peak"] = g["gflops"] * 1e9 / peak
        result["shapes"] = top
        print(f"the {len(top)} task groups that take the most time:")
        for g in top:
            shown = " ".join(f"{k}={v:g}" for k, v in g["params"].items())
            print(f"  {g['kernel']:<15}{g['tasks']:>5}{g['s']:>9.4f} s{g['gflops']:>7.1f} GFLOP/s"
                  f"{g['of_peak']:>5.0%}  {shown}")
    print(f"all kernels {all_s:.4f} s, BLAS kernels {gemm_s / all_s:.1%}", end="")
    if args.cold:
        cold_all = sum(total["cold"].values())
        result.update(cold_kernels_s=cold_all)
        print(f"; cold tiles {cold_all:.4f} s ({cold_all / all_s:.2f}x)", end="")
    if args.baseline:
        base_all = sum(total["base"].values())
        base_gemm = sum(v for name, v in total["base"].items() if name in GEMM_KERNELS)
        result.update(baseline=args.baseline, baseline_kernels_s=base_all, baseline_blas_time_share=base_gemm / max(base_all, 1e-30))
        print(f"; baseline {args.baseline}: {base_all:.4f} s, BLAS kernels {base_gemm / max(base_all, 1e-30):.1%}", end="")
    print()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
