"""Which GPT-2 sizes a PyTorch user can train on this machine's RAM, and which tilecast can with disk offload.

The PyTorch step is what a user without offload would write: ``transformers.GPT2LMHeadModel`` in float32,
``model.gradient_checkpointing_enable()``, ``torch.optim.AdamW``, one forward/backward/step on random tokens at a
small batch. Each measured model runs in its own child process under a hard address-space cap
(``RLIMIT_AS``, ``--cap``), which reports its peak resident set size (``ru_maxrss``) and each step's seconds; a
child that hits the cap reports what it was doing and its resident size then (``torch_failed``: a size seen
failing, its peak then estimated). Sizes not measured are estimated: 16 bytes per parameter (float32 parameters,
gradients and two AdamW moments) plus the overhead measured on the largest measured model (Python, torch,
activations at this batch), labelled "estimated".

PyTorch can train a size when its peak RSS is below this machine's MemTotal. tilecast can train it under
``--memory-limit`` with ``--offload-dir`` when the part that does not fit in the limit (16 bytes per parameter,
less the limit) fits in the offload directory's free space (docs/memory.md).

Last line: one JSON object: ``mem_total_bytes``, ``offload_free_bytes``, ``memory_limit_bytes`` and ``rows``,
one per model with ``model``, ``params``, ``state_bytes`` (16 x params), ``torch_peak_rss_bytes``,
``torch_measured`` (true when measured here, false when estimated), ``torch_fits`` and ``tilecast_fits``;
``torch_step_s`` (measured) or ``torch_failed`` (``failed``: what it was doing, ``rss``, ``error``, ``cap_bytes``).

    python3 benchmarks/torch_memory.py                                   # gpt2, gpt2-medium measured
    python3 benchmarks/torch_memory.py --measure gpt2-tiny --batch 1 --seq 32
    python3 benchmarks/torch_memory.py --measure gpt2-large gpt2-xl --cap 23GiB   # this machine's RAM
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys

from tilecast.executor.memory_limit import format_size, parse_size
from tilecast.graph.model_config import load_model
from tilecast.home import home

GPT2 = ["gpt2-tiny", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"]
STATE_BYTES_PER_PARAM = 16  # float32 parameter, gradient, AdamW first and second moments


def current_rss() -> int:
    """This process's resident set size now (bytes), from /proc/self/statm."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def torch_step(model: str, batch: int, seq: int, steps: int) -> dict:
    """One child's work: PyTorch training steps with gradient checkpointing. Returns ``peak_rss`` (bytes) and
    ``step_s`` (each step's seconds); where an allocation fails (the cap), ``failed`` (what it was doing),
    ``rss`` (bytes resident then) and ``error`` instead, so that a size that does not fit is seen failing."""
    import time

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = load_model(model)
    torch.manual_seed(0)
    phase, times = "building the model", []
    try:
        net = GPT2LMHeadModel(GPT2Config(n_layer=cfg.n_layer, n_embd=cfg.n_embd, n_head=cfg.n_head,
                                         vocab_size=cfg.vocab_size, n_positions=cfg.n_positions))
        net.gradient_checkpointing_enable()
        net.train()
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
        for i in range(steps):
            t0 = time.perf_counter()
            ids = torch.randint(0, cfg.vocab_size, (batch, seq))
            phase = f"step {i + 1}: forward and backward"
            loss = net(input_ids=ids, labels=ids).loss
            loss.backward()
            phase = f"step {i + 1}: AdamW"
            opt.step()
            opt.zero_grad(set_to_none=False)  # gradients stay allocated, as in a training loop's steady state
            times.append(time.perf_counter() - t0)
    except (MemoryError, RuntimeError) as e:  # torch's allocator raises RuntimeError when the cap refuses it
        return dict(failed=phase, rss=current_rss(), error=str(e).splitlines()[0][:160])
    return dict(peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, step_s=times)


def measure(model: str, batch: int, seq: int, steps: int, cap: int) -> dict:
    """What torch_step returned in a child under RLIMIT_AS=cap; ``failed`` set where it failed or died."""
    code = (f"import json, resource, sys; resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap})); "
            f"sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); import torch_memory; "
            f"print(json.dumps(torch_memory.torch_step({model!r}, {batch}, {seq}, {steps})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        got = dict(failed="the child process", error=f"exit status {proc.returncode}: {last[:120]}")
    else:
        got = json.loads(lines[-1])
    if "failed" in got:
        at = f" at {format_size(got['rss'])} resident" if got.get("rss") else ""
        print(f"  {model}: failed under a {format_size(cap)} cap while {got['failed']}{at} ({got['error']})",
              file=sys.stderr)
    return got


def mem_total() -> int:
    """This machine's MemTotal in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def table(models: list[str], measured: dict[str, int | None], total: int, offload_free: int,
          limit: int, failed: dict | None = None, step_s: dict | None = None) -> list[dict]:
    """One row per model: measured or estimated PyTorch peak RSS, and whether each tool can train it here.
    ``failed``: per model that failed under its cap, what measure() said (kept in the row as ``torch_failed``:
    a size seen failing); ``step_s``: per measured model, its steps' seconds."""
    failed, step_s = failed or {}, step_s or {}
    params = {m: load_model(m).n_params() for m in models}
    done = [m for m in models if measured.get(m) is not None]
    overhead = 0
    if done:
        big = max(done, key=lambda m: params[m])
        overhead = measured[big] - STATE_BYTES_PER_PARAM * params[big]
    rows = []
    for m in models:
        state = STATE_BYTES_PER_PARAM * params[m]
        rss = measured.get(m)
        known = rss is not None
        fits = None
        if not known:
            rss = state + max(0, overhead)
            if m in failed:  # it held this much when an allocation failed; under a cap of MemTotal it cannot fit
                rss = max(rss, failed[m].get("rss") or 0)
                fits = False if failed[m].get("cap_bytes", 0) >= total else None
        row = dict(model=m, params=params[m], state_bytes=state, torch_peak_rss_bytes=rss,
                   torch_measured=known, torch_fits=rss < total if fits is None else fits,
                   tilecast_fits=max(0, state - limit) <= offload_free)
        if m in failed:
            row["torch_failed"] = failed[m]
        if m in step_s:
            row["torch_step_s"] = step_s[m]
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", nargs="*", default=["gpt2", "gpt2-medium"], metavar="MODEL",
                    help="models whose PyTorch step is run and measured (default: gpt2 gpt2-medium)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2, help="PyTorch steps per measured model (default: 2)")
    ap.add_argument("--cap", default="10GiB", metavar="SIZE",
                    help="address-space cap of each measuring child (default: 10GiB)")
    ap.add_argument("--memory-limit", default="2GiB", metavar="SIZE",
                    help="tilecast's --memory-limit assumed for the offload column (default: 2GiB)")
    ap.add_argument("--offload-dir", default=None, metavar="DIR",
                    help="directory whose free space bounds tilecast (default: $TILECAST_HOME)")
    args = ap.parse_args()
    for m in args.measure:
        if m not in GPT2:
            ap.error(f"--measure: {m!r} is not one of {', '.join(GPT2)}")
    cap, limit = parse_size(args.cap), parse_size(args.memory_limit)
    where = args.offload_dir or str(home())
    os.makedirs(where, exist_ok=True)
    total, offload_free = mem_total(), shutil.disk_usage(where).free
    measured, failed, step_s = {}, {}, {}
    for m in args.measure:
        print(f"measuring {m} (batch {args.batch} x {args.seq}, {args.steps} steps, cap {format_size(cap)}) ...",
              file=sys.stderr, flush=True)
        got = measure(m, args.batch, args.seq, args.steps, cap)
        if "failed" in got:
            failed[m], measured[m] = {**got, "cap_bytes": cap}, None
        else:
            measured[m], step_s[m] = got["peak_rss"], got["step_s"]
    rows = table(GPT2, measured, total, offload_free, limit, failed, step_s)
    print(f"MemTotal {format_size(total)}; offload dir {where}: {format_size(offload_free)} free; tilecast at "
          f"--memory-limit {format_size(limit)}; PyTorch float32, gradient checkpointing, AdamW, batch "
          f"{args.batch} x {args.seq}")
    print(f"{'model':<12}{'params':>9}{'16 B/param':>12}{'PyTorch peak RSS':>22}{'PyTorch':>9}{'tilecast':>10}")
    for r in rows:
        how = "measured" if r["torch_measured"] else "estimated*" if "torch_failed" in r else "estimated"
        print(f"{r['model']:<12}{r['params'] / 1e6:>8.0f}M{format_size(r['state_bytes']):>12}"
              f"{format_size(r['torch_peak_rss_bytes']):>12} {how:>9}{'yes' if r['torch_fits'] else 'no':>9}"
              f"{'yes' if r['tilecast_fits'] else 'no':>10}")
    for r in rows:
        if "torch_failed" in r:
            f = r["torch_failed"]
            at = f" at {format_size(f['rss'])} resident" if f.get("rss") else ""
            print(f"* {r['model']}: PyTorch failed under the {format_size(f['cap_bytes'])} cap while {f['failed']}"
                  f"{at}: {f['error']}")
    print(json.dumps(dict(mem_total_bytes=total, offload_dir=where, offload_free_bytes=offload_free,
                          memory_limit_bytes=limit, batch=args.batch, seq=args.seq, rows=rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
