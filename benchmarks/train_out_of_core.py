"""`tilecast train` with --memory-limit and disk offload: same losses as without a limit, and after a resume.

A preset with GPT-2's vocabulary is trained with vocab_size 256 (``train`` reads bytes; every other size is the
preset's). Three runs of ``tilecast train --json`` on the same model, batch, tiling and seed:

1. without a limit, ``--steps N``;
2. with ``--memory-limit SIZE --offload-dir DIR``, ``--steps N``;
3. with the limit, stopped after ``--steps K`` with a checkpoint, then resumed from it (``--resume``) to step N.

It prints each run's mean step time, the peak resident set size of each
``tilecast`` process (``ru_maxrss`` of the child, from ``os.wait4``), the losses, and whether the limited and
resumed losses equal the unlimited ones exactly (the arithmetic is the same, so they must). Disk bytes per step
come from one extra ``tilecast run --json`` step under the same limit (``train`` does not report StarPU's bus
counters). Last line: one JSON object with ``step_s`` ({"unlimited", "limited"}, seconds), ``disk_bytes``
({"written", "read"}, bytes per step), ``peak_rss_bytes`` ({"unlimited", "limited", "resumed"}), ``losses``,
``limited_equal``, ``resumed_equal`` and the run conditions.

    python3 benchmarks/train_out_of_core.py                         # gpt2-medium, batch 1 x 64, 2GiB, 3 steps
    python3 benchmarks/train_out_of_core.py --model gpt2-tiny --batch 4 --seq 64 --tile 32 --memory-limit 4MiB
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

from tilecast.executor.memory_limit import format_size
from tilecast.graph.model_config import PRESETS, load_model
from tilecast.home import home
from tilecast.perfmodel.local import conditions_line, run_conditions


def byte_model(name: str) -> str:
    """A preset as an inline GPT-2 config with vocab_size 256 (``train`` trains on bytes), else NAME unchanged."""
    if name not in PRESETS or load_model(name).vocab_size == 256:
        return name
    c = load_model(name)
    return json.dumps(dict(model_type="gpt2", n_layer=c.n_layer, n_embd=c.n_embd, n_head=c.n_head, vocab_size=256,
                           n_positions=c.n_positions))


def tilecast(argv: list[str]) -> tuple[dict, int]:
    """Run ``python3 -m tilecast ARGV --json``; its JSON and the child's peak RSS in bytes (Linux: KiB x 1024)."""
    proc = subprocess.Popen([sys.executable, "-m", "tilecast", *argv, "--json"], stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"train_out_of_core: tilecast {' '.join(argv)} exited {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1]), usage.ru_maxrss * 1024


def mean_step(res: dict) -> float:
    """Mean step time in seconds (``train`` reports the sum of its step times)."""
    return res["step_time_s"] / max(1, len(res["losses"]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2-medium")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--tile", default="128")
    ap.add_argument("--memory-limit", default="2GiB", metavar="SIZE")
    ap.add_argument("--offload-dir", default=None, metavar="DIR",
                    help="disk node directory (default: a new directory under $TILECAST_HOME/offload, removed "
                         "at the end)")
    ap.add_argument("--sched", default="dmda")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3, help="steps of each run (default: 3)")
    ap.add_argument("--resume-at", type=int, default=None, metavar="K",
                    help="the interrupted run stops at step K with a checkpoint (default: steps - 1)")
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("--steps must be at least 2 (a checkpoint, then a resumed step)")
    k = args.resume_at if args.resume_at is not None else args.steps - 1
    if not 1 <= k < args.steps:
        ap.error("--resume-at must be between 1 and --steps - 1")
    made = args.offload_dir is None
    base = home("offload")
    base.mkdir(parents=True, exist_ok=True)
    offload = tempfile.mkdtemp(prefix="train-", dir=base) if made else args.offload_dir
    work = tempfile.mkdtemp(prefix="ckpt-", dir=base)
    common = ["--model", byte_model(args.model), "--batch", str(args.batch), "--seq", str(args.seq), "--tile", args.tile,
              "--sched", args.sched, "--workers", str(args.workers), "--seed", "0"]
    train = ["train", *common, "--eval-every", "1000000", "--eval-batches", "1"]
    limit = ["--memory-limit", args.memory_limit, "--offload-dir", offload]
    conditions = run_conditions()
    print(conditions_line(conditions))
    print(f"{args.model}, batch {args.batch} x {args.seq}, tile {args.tile}, {args.sched} on {args.workers} workers, "
          f"{args.steps} steps; memory limit {args.memory_limit}, offload to {offload}", flush=True)
    try:
        free, rss = {}, {}
        free["unlimited"], rss["unlimited"] = tilecast([*train, "--steps", str(args.steps)])
        print(f"unlimited: losses {free['unlimited']['losses']}", flush=True)
        free["limited"], rss["limited"] = tilecast([*train, *limit, "--steps", str(args.steps)])
        print(f"limited:   losses {free['limited']['losses']}", flush=True)
        ckpt = os.path.join(work, "ckpt.npz")
        first, _ = tilecast([*train, *limit, "--steps", str(k), "--checkpoint", ckpt])
        rest, rss["resumed"] = tilecast([*train, *limit, "--steps", str(args.steps), "--checkpoint", ckpt,
                                         "--resume"])
        if first["losses"] != rest["losses"][:k] or rest["start_step"] != k:
            raise SystemExit(f"train_out_of_core: the resumed run did not start from the checkpoint of step {k}")
        resumed = rest["losses"]  # the checkpoint's losses of steps 1..K, then those computed after the resume
        print(f"resumed:   losses {resumed} (stopped at step {k}, resumed from its checkpoint)", flush=True)
        one, _ = tilecast(["run", *common, *limit, "--steps", "1"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if made:
            shutil.rmtree(offload, ignore_errors=True)
    written, read = one["disk_written_bytes"][-1], one["disk_read_bytes"][-1]
    base_losses = free["unlimited"]["losses"]
    limited_equal = free["limited"]["losses"] == base_losses
    resumed_equal = resumed == base_losses
    step_s = {name: mean_step(res) for name, res in free.items()}
    print(f"\n{'run':<10}{'step s':>10}{'peak RSS':>12}")
    for name in ("unlimited", "limited"):
        print(f"{name:<10}{step_s[name]:>10.2f}{format_size(rss[name]):>12}")
    print(f"{'resumed':<10}{'':>10}{format_size(rss['resumed']):>12}")
    print(f"disk per step under the limit: {format_size(written)} written, {format_size(read)} read")
    print(f"losses equal with the limit: {limited_equal}; equal after the resume: {resumed_equal}")
    print(json.dumps({
        "model": args.model, "batch": args.batch, "seq": args.seq, "tiling": args.tile, "sched": args.sched,
        "workers": args.workers, "steps": args.steps, "resume_at": k, "memory_limit": args.memory_limit,
        "step_s": step_s, "disk_bytes": {"written": written, "read": read}, "peak_rss_bytes": rss,
        "losses": {"unlimited": base_losses, "limited": free["limited"]["losses"], "resumed": resumed},
        "limited_equal": limited_equal, "resumed_equal": resumed_equal, "conditions": conditions,
    }))
    return 0 if limited_equal and resumed_equal else 1


if __name__ == "__main__":
    sys.exit(main())
