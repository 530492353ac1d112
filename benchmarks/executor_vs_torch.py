"""A GPT-2-width training step on StarPU, as ``tilecast tune`` configures it, against PyTorch eager on the same cores.

Models (``--models``, default both), each with ``--layers`` layers (default: 2
and 12); batch 4 x 256 tokens; float32; AdamW:

- gpt2: n_embd 768, 12 heads, vocabulary 50257 (GPT-2 small's widths), against
  transformers' GPT2LMHeadModel;
- llama: the same width, heads and vocabulary as a Llama: 4 key/value heads
  (groups of 3 query heads), a SwiGLU MLP of inner size 2048 (3 x 768 x 2048
  weights, as many as GPT-2's 2 x 768 x 3072), RMSNorm, RoPE, no biases, an
  untied LM head; against transformers' LlamaForCausalLM with eager attention.

The StarPU configuration (tiling and scheduler) is the one ``tilecast tune``
ranks first for ``--workers`` workers, not one chosen for this benchmark;
``--tile`` and ``--sched`` override it. The machine is calibrated first for
every model's candidates at once (``tilecast.loop.tune.calibrate_candidates``:
the host-cost probes, then a design of the kernel shapes timed under one
budget, the others predicted by the shape model), which is skipped when
``$TILECAST_HOME`` holds them; how long that took, how many shapes were
timed and the tiling tune picked are printed and in the JSON. Steps of
the two alternate (StarPU paused during torch's), so that load from other
processes hits both alike; figures are medians over the steps after the first.

The peak is the C kernels' own BLAS: ``--workers`` threads each running
single-threaded 1024^3 SGEMMs at once, as StarPU's workers run them
(``tilecast.perfmodel.local.measure_kernel_gemm_rate``), measured after each
pair of steps. The last StarPU step is traced to show where its time goes:
each kernel's rate against the per-worker peak, idle workers, and the host's
time outside the task graph (``tilecast.reports.time_budget``).

Prints a table per model, then one JSON line with a row per model
(family, starpu_tokens_per_s, torch_tokens_per_s, ratio, gemm_share, needed_gemm_share: the gemm_share
that the target ratio asks for against this PyTorch figure, ceiling_ratio: the ratio of a step whose every
FLOP ran at the 2-thread SGEMM rate (above it no runtime or kernel change on this BLAS can go), tiling, sched,
chosen_by, tune_s: seconds tune took after calibration; idle_by_tenth: the idle share of worker time in each
tenth of the last traced step's makespan, first to last; torch_setup: PyTorch's version, threads, dtype,
batch, attention implementation, optimizer, autocast and compile, as run; load: others_cpu_s, the CPU
seconds other processes took while the model was measured, steal_s, the seconds the hypervisor took,
others_share, others_cpu_s over cores x wall time, near 0 on a quiet machine; ...) and ``calibration``
(calibration_s: wall seconds of the host-cost probes and kernel timing;
shapes, timed, predicted: kernel shapes of the candidates, timed, left to the
shape model; heldout_median_rel_err, heldout_max_rel_err: per kernel, the
shape model's relative error on timed shapes held out of its fit; null with
``--tile`` and ``--sched``).
PyTorch runs its plain eager setup on the same threads, batch and float32
(``torch_stepper``), with freed memory kept in the process (``--malloc``,
``keep_freed_memory``); ``conditions.malloc`` says which.
Targets: ratio >= 1.5 (gpt2) and >= 1.2 (llama), gemm_share >= 0.75 for every model.

    python3 benchmarks/executor_vs_torch.py [--models gpt2,llama] [--layers 2,12] [--workers 2] [--steps 4]
                                            [--tile SPEC --sched NAME] [--malloc keep|glibc]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import numpy as np

from tilecast.executor.starpu_run import StarPUTraining
from tilecast.executor.starpu_session import StarPUSession
from tilecast.reference.step import TrainState, init_params
from tilecast.graph import Tiling
from tilecast.graph.gpt2 import AdamWConfig
from tilecast.graph.model_config import load_model
from tilecast.graph.models import build_step
from tilecast.perfmodel.local import conditions_line, cpu_count, measure_kernel_gemm_rate, run_conditions
from tilecast.reports.time_budget import kernel_rates, time_budget

TARGET_RATIO = {"gpt2": 1.5, "llama": 1.2}
TARGET_GEMM_SHARE = 0.75
SHAPES = {"gpt2": dict(n_embd=768, n_head=12, vocab_size=50257, n_positions=1024),
          "llama": dict(family="llama", n_embd=768, n_head=12, n_kv_head=4, intermediate_size=2048,
                        vocab_size=50257, n_positions=1024)}


def model(family: str, layers: int):
    return load_model(json.dumps(dict(n_layer=layers, **SHAPES[family]), separators=(",", ":")))


def describe(cfg) -> str:
    if cfg.family == "llama":
        return (f"Llama n_embd {cfg.n_embd}, {cfg.n_head} heads ({cfg.n_kv_head} key/value), inner "
                f"{cfg.n_inner}, {cfg.n_layer} layers, vocab {cfg.vocab_size}, untied")
    return f"GPT-2 n_embd {cfg.n_embd}, {cfg.n_head} heads, {cfg.n_layer} layers, vocab {cfg.vocab_size}"


def gpt2_model(cfg, transformers):
    conf = transformers.GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.n_positions, n_embd=cfg.n_embd,
                                   n_layer=cfg.n_layer, n_head=cfg.n_head, activation_function="gelu_new",
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(conf).float().train()


def torch_stepper(cfg, batch, seq, threads, data):
    """One PyTorch training step per call (wall seconds, loss), and how PyTorch is set up, for the JSON.

    PyTorch's plain eager setup on the same threads: float32, no autocast, no
    torch.compile, transformers' default attention (``sdpa``: PyTorch's fused
    scaled-dot-product attention), ``torch.optim.AdamW`` in its default
    multi-tensor (foreach) form.
    """
    import torch
    import transformers

    torch.set_num_threads(threads)
    if cfg.family == "llama":
        from tilecast.reference.verify import hf_model

        model = hf_model(cfg, 0)  # LlamaForCausalLM, eager attention, float32, training mode
    else:
        model = gpt2_model(cfg, transformers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = {"t": 0}
    setup = {"torch": torch.__version__, "transformers": transformers.__version__,
             "threads": torch.get_num_threads(), "dtype": "float32", "batch": [batch, seq],
             "attention": getattr(model.config, "_attn_implementation", None),
             "optimizer": "torch.optim.AdamW (foreach)", "autocast": False, "compile": False}

    def step():
        t = state["t"]
        ids = torch.from_numpy(data[t, :, :-1])
        targets = torch.from_numpy(data[t, :, 1:])
        t0 = time.perf_counter()
        logits = model(ids).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), targets.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        state["t"] += 1
        return time.perf_counter() - t0, float(loss.detach())

    return step, setup


class OtherLoad:
    """CPU time that other processes took on this machine while measuring (``/proc/stat`` less this
    process's own user and system time), and the time the hypervisor took away (steal): a run with
    ``others_share`` near 0 was quiet."""

    def __init__(self):
        self.tick = os.sysconf("SC_CLK_TCK")
        self.start = self._sample()

    def _sample(self):
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        busy = (v[0] + v[1] + v[2] + v[5] + v[6]) / self.tick
        return busy, v[7] / self.tick, own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime, time.monotonic()

    def result(self, cores: int) -> dict:
        end = self._sample()
        if self.start is None or end is None:
            return {"others_cpu_s": None, "steal_s": None, "others_share": None}
        busy, steal, own, wall = (b - a for a, b in zip(self.start, end))
        others = max(0.0, busy - own)
        return {"others_cpu_s": round(others, 2), "steal_s": round(steal, 2),
                "others_share": round(others / (cores * wall), 4) if wall > 0 else None}


def calibrate(cfgs, batch, seq, workers):
    """Calibrate for every model's tune candidates at once; a summary for the JSON, printed."""
    from tilecast.loop.tune import calibrate_candidates

    cal, wall = calibrate_candidates([(cfg, batch, seq) for cfg in cfgs], workers=[workers])
    run = cal.last_run or {}
    out = {"calibration_s": round(wall, 1), "shapes": run.get("cases", 0), "timed": run.get("timed", 0),
           "predicted": run.get("predicted", 0), "budget_s": run.get("budget_s"),
           "heldout_median_rel_err": {k: round(r["median_rel_err"], 4) for k, r in run.get("heldout", {}).items()},
           "heldout_max_rel_err": {k: round(r["max_rel_err"], 4) for k, r in run.get("heldout", {}).items()}}
    what = (f"timed {out['timed']} of {out['shapes']} kernel shapes, the rest predicted by the shape model"
            if run else "nothing left to time: the stored calibration covers every candidate")
    print(f"calibration for tune's candidates: {wall:.0f} s ({what})")
    return out


def tuned_config(cfg, batch, seq, workers):
    """The tiling and scheduler that ``tilecast tune`` ranks first for this step on ``workers`` workers,
    its predicted step time and the seconds tune took."""
    from tilecast.loop.tune import tune

    start = time.monotonic()
    best = tune(cfg, batch, seq, workers=[workers]).ranking[0]
    return best.config.tiling, best.config.sched, best.step_s, time.monotonic() - start


def measure(cfg, args, tiling, sched):
    data = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(args.steps, args.batch, args.seq + 1))
    graph = build_step(cfg, args.batch, args.seq, tiling, AdamWConfig(lr=1e-3))
    torch_step, torch_setup = torch_stepper(cfg, args.batch, args.seq, args.workers, data)
    ours, spans, theirs, peaks, trace = [], [], [], [], None
    load = OtherLoad()
    with StarPUSession(sched, args.workers) as session:
        training = StarPUTraining(session, graph, TrainState(init_params(cfg, 0)), data)
        for t in range(args.steps):
            dt, _, trace = training.step(trace=t == args.steps - 1)
            ours.append(dt)
            spans.append(session.last_makespan_s)
            theirs.append(torch_step()[0])
            peaks.append(measure_kernel_gemm_rate(args.workers))
    return graph, ours, spans, theirs, peaks, trace, torch_setup, load.result(cpu_count())


def idle_by_tenth(trace, workers: int) -> list[float]:
    """Idle worker time in each tenth of the traced step's makespan, as a share of that tenth's worker time:
    whether the idle workers wait at the step's start, its end (the optimizer after the last gradient) or
    throughout."""
    tasks = trace[trace["task"] >= 0]
    if tasks.empty:
        return []
    t0, t1 = float(tasks["start_s"].min()), float(tasks["end_s"].max())
    edges = np.linspace(t0, t1, 11)
    start, end = tasks["start_s"].to_numpy(), tasks["end_s"].to_numpy()
    out = []
    for a, b in zip(edges[:-1], edges[1:]):
        busy = np.clip(np.minimum(end, b) - np.maximum(start, a), 0.0, None).sum()
        out.append(round(max(0.0, 1.0 - busy / (workers * (b - a))), 3) if b > a else 0.0)
    return out


def keep_freed_memory() -> bool:
    """Make glibc keep the memory this process frees for its next allocations (no mmap for large blocks,
    no trimming of the heap), as a caching allocator (jemalloc, tcmalloc) would; whether it took effect.

    PyTorch's CPU tensors come from malloc: with glibc's defaults each step maps and unmaps its large
    activations and gradients (hundreds of MB) and faults their pages in again. On a virtual machine that
    hands freed pages back to the host (free page reporting) that refault costs more and varies from run
    to run. StarPU's tiles are allocated once, so this only matters to PyTorch's side.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # glibc's malloc.h
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 1 << 30))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2,llama", help="model families, comma-separated (default: gpt2,llama)")
    ap.add_argument("--layers", default="2,12", help="layer counts, comma-separated (default: 2,12)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--tile", default=None, help="tiling (default: the one tune ranks first)")
    ap.add_argument("--sched", default=None, help="StarPU policy (default: the one tune ranks first)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--malloc", choices=("keep", "glibc"), default="keep",
                    help="keep: freed memory stays in the process for the next allocations (PyTorch's best "
                         "setup here, see keep_freed_memory); glibc: glibc's defaults (default: keep)")
    args = ap.parse_args()
    families = [f.strip() for f in args.models.split(",") if f.strip()]
    if not families or set(families) - set(SHAPES):
        ap.error(f"--models: a comma-separated list of {', '.join(SHAPES)}, got {args.models!r}")
    if args.tile is not None:
        from tilecast.graph import TilingError

        try:
            Tiling.parse(args.tile)
        except TilingError as e:
            ap.error(f"--tile: {str(e).removeprefix('tile: ')}")
    conditions = run_conditions()
    conditions["malloc"] = "keep" if args.malloc == "keep" and keep_freed_memory() else "glibc"
    print(conditions_line(conditions) + f"; malloc {conditions['malloc']}")
    rows = []
    steps = [(f, int(x)) for f in families for x in args.layers.split(",")]
    tuned = args.tile is None or args.sched is None
    calibration = calibrate([model(f, n) for f, n in steps], args.batch, args.seq, args.workers) if tuned else None
    for family, layers in steps:
        cfg = model(family, layers)
        predicted = tune_s = None
        if tuned:
            tiling, sched, predicted, tune_s = tuned_config(cfg, args.batch, args.seq, args.workers)
            print(f"tune picked tiling {tiling.describe()}, {sched} for {describe(cfg)} (predicted step "
                  f"{predicted:.3f} s; tune took {tune_s:.0f} s after calibration)")
        tiling = Tiling.parse(args.tile) if args.tile is not None else tiling
        sched = args.sched or sched
        graph, ours, spans, theirs, peaks, trace, torch_setup, load = measure(cfg, args, tiling, sched)
        s_step, t_step = float(np.median(ours[1:] or ours)), float(np.median(theirs[1:] or theirs))
        peak, tokens, flops = float(np.median(peaks)), args.batch * args.seq, float(graph.flops.sum())
        s_tps, t_tps, gflops = tokens / s_step, tokens / t_step, flops / s_step / 1e9
        budget = time_budget(trace, ours[-1], args.workers)
        rates = kernel_rates(trace, peak / args.workers)
        row = dict(family=family, layers=layers, model=cfg.shape(), starpu_tokens_per_s=round(s_tps, 2),
                   torch_tokens_per_s=round(t_tps, 2),
                   ratio=round(s_tps / t_tps, 3), gemm_share=round(gflops * 1e9 / peak, 3),
                   needed_gemm_share=round(TARGET_RATIO[family] * t_tps * flops / tokens / peak, 3),
                   ceiling_ratio=round(peak / flops * tokens / t_tps, 3),
                   starpu_gflops=round(gflops, 2), torch_gflops=round(flops / t_step / 1e9, 2),
                   gemm_peak_gflops=round(peak / 1e9, 2), starpu_step_s=round(s_step, 4),
                   torch_step_s=round(t_step, 4), predicted_step_s=predicted,
                   tune_s=round(tune_s, 1) if tune_s is not None else None,
                   host_s=round(float(np.median(np.subtract(ours[1:] or ours, spans[1:] or spans))), 5),
                   tiling=tiling.describe(), sched=sched,
                   chosen_by="tune" if args.tile is None and args.sched is None else
                   "given" if args.tile is not None and args.sched is not None else "tune, then --tile/--sched",
                   workers=args.workers, tasks=graph.n_tasks, torch_setup=torch_setup, load=load,
                   last_step={k: round(v, 4) for k, v in budget.items()},
                   idle_by_tenth=idle_by_tenth(trace, args.workers),
                   kernels={k: dict(busy_s=round(r.busy_s, 4), gflops=round(r.gflops, 1) if r.gflops == r.gflops
                                    else None, of_peak=round(r.of_peak, 3) if r.of_peak == r.of_peak else None)
                            for k, r in rates.iterrows()})
        rows.append(row)
        print(f"\n{describe(cfg)}; batch {args.batch} x {args.seq}; tiling "
              f"{tiling.describe()}, {sched} on {args.workers} workers ({row['chosen_by']}); {graph.n_tasks} tasks")
        print(f"{'':<10}{'step s':>10}{'tokens/s':>12}{'GFLOP/s':>10}")
        print(f"{'StarPU':<10}{s_step:>10.3f}{s_tps:>12.1f}{gflops:>10.1f}")
        print(f"{'PyTorch':<10}{t_step:>10.3f}{t_tps:>12.1f}{flops / t_step / 1e9:>10.1f}")
        print(f"ratio {s_tps / t_tps:.2f}x (target >= {TARGET_RATIO[family]}); StarPU at "
              f"{100 * gflops * 1e9 / peak:.0f}% of "
              f"the kernels' SGEMM rate on {args.workers} threads ({peak / 1e9:.0f} GFLOP/s; target >= "
              f"{100 * TARGET_GEMM_SHARE:.0f}%)")
        print(f"{TARGET_RATIO[family]}x PyTorch needs {100 * row['needed_gemm_share']:.0f}% of that SGEMM rate over "
              f"the step's {flops / 1e9:.0f} GFLOP; every FLOP at that rate would be {row['ceiling_ratio']:.2f}x")
        print(f"PyTorch: {torch_setup['torch']}, {torch_setup['threads']} threads, float32, attention "
              f"{torch_setup['attention']}, {torch_setup['optimizer']}; other processes took "
              f"{load['others_cpu_s']} CPU s ({100 * (load['others_share'] or 0):.1f}% of the cores), steal "
              f"{load['steal_s']} s")
        print(f"last step: {100 * budget['busy_share']:.1f}% in kernels, {100 * budget['idle_share']:.1f}% idle "
              f"workers, {100 * budget['host_share']:.1f}% outside the task graph ({1e3 * budget['host_s']:.1f} ms)")
        print("idle workers in each tenth of the makespan: " + " ".join(f"{100 * x:.0f}%" for x in row["idle_by_tenth"]))
        print(f"  {'kernel':<16}{'tasks':>7}{'busy s':>9}{'GFLOP/s':>9}{'of peak':>9}")
        for k, r in rates.head(10).iterrows():
            print(f"  {k:<16}{r.tasks:>7}{r.busy_s:>9.3f}{r.gflops:>9.1f}{r.of_peak:>9.0%}")
    met = all(r["ratio"] >= TARGET_RATIO[r["family"]] and r["gemm_share"] >= TARGET_GEMM_SHARE for r in rows)
    print(json.dumps({"models": rows, "calibration": calibration, "targets_met": met, "target_ratio": TARGET_RATIO,
                      "target_gemm_share": TARGET_GEMM_SHARE, "conditions": conditions}))


if __name__ == "__main__":
    sys.exit(main())
