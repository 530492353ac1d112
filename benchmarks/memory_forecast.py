"""Predicted against measured memory-limited steps: several tilings and limits, each run by out_of_core.py.

For each configuration (``TILE:LIMIT[:RECOMPUTE]``) it runs ``benchmarks/out_of_core.py`` (which
prints the simulator's forecast, then runs ``--warmup`` + ``--steps`` steps on StarPU with the
limit and a disk node), ``--repeats`` times, one configuration after the other in turn (so a slow
spell of a shared machine does not fall on one configuration only), and prints, per configuration,
the predicted step and the median measured one, and the bytes written to and read from the disk
per step, predicted and measured.

Without ``--fit``/``--fit-first`` nothing is fitted here: every forecast uses the disk node as
``tilecast calibrate --disk-only`` stored it (the file system's speed and StarPU's time in the workers,
fitted on its own probe steps; docs/memory.md), so every row is out of sample.

With ``--fit-first``, StarPU's own cost per disk transfer (the time a transfer
takes inside StarPU beyond the file system's, which ``calibrate`` cannot see)
is fitted on the first configuration's first run: the measured step less the
forecast, over the forecast's disk transfers, added to the stored disk node
(``runtime_latency``); every later run is forecast with it, so the other
configurations test the model out of sample.

With ``--fit N``, StarPU's costs are fitted on the first N configurations' first
runs instead (least squares on relative errors): the cost per disk transfer and,
for runs that prefetch (``STARPU_PREFETCH=1``; memory-limited runs do not by
default), the cost per transfer and tile held in main memory (``walk_s``: the
failed prefetches' walks of StarPU's list of tiles, docs/memory.md).

Last line: one JSON object: ``fitted_runtime_latency_s``, ``fitted_walk_s`` (s, or null), ``fitted_on``,
``rows`` (one per configuration: ``tiling``, ``limit``, ``recompute``,
``predicted_step_s``, ``measured_step_s`` (median over repeats of each repeat's median step),
``repeats_step_s``, ``predicted_disk_bytes`` and ``disk_bytes`` (``written``, ``read``, bytes per
step), ``predicted_evictions``, ``fitted``: whether the row was fitted on, and so is no validation figure) and
the run conditions.

    python3 benchmarks/memory_forecast.py --configs 32:2MiB,32:4MiB,32:8MiB,64:4MiB,64:6MiB,64:12MiB
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_configs(text: str) -> list[tuple[str, str, str]]:
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) not in (2, 3):
            raise SystemExit(f"memory_forecast: --configs: {item!r} is not TILE:LIMIT[:RECOMPUTE]")
        out.append((parts[0], parts[1], parts[2] if len(parts) == 3 else "none"))
    return out


def run_one(args, tile: str, limit: str, recompute: str) -> dict:
    cmd = [sys.executable, os.path.join(HERE, "out_of_core.py"), "--model", args.model, "--batch", str(args.batch),
           "--seq", str(args.seq), "--tile", tile, "--memory-limit", limit, "--recompute", recompute,
           "--sched", args.sched, "--workers", str(args.workers), "--warmup", str(args.warmup),
           "--steps", str(args.steps)]
    print("$ " + " ".join(cmd[1:]), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"memory_forecast: {tile}:{limit} failed: {p.stderr.strip().splitlines()[-1:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def fit_runtime_latency(doc: dict, config) -> float:
    """StarPU's cost per disk transfer that makes the forecast of ``doc``'s run (out_of_core.py's JSON) equal its
    measured step, stored with the local machine's disk node; returns it (s)."""
    from dataclasses import replace

    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.disk_node import save_disk, stored_disk

    machine = load_machine("local")
    disk = stored_disk(machine)
    transfers = max(doc["predicted_disk_transfers"], 1)
    latency = max(disk.runtime_latency + (doc["step_s"] - doc["predicted_step_s"]) / transfers, 0.0)
    save_disk(machine, replace(disk, worker_costs={}, worker_costs_source="", worker_costs_by_workers={},
                               runtime_latency=latency, runtime_source=(
        f"fitted: out_of_core.py {doc['model']} {doc['batch']}x{doc['seq']} tile {config[0]} limit {config[1]}, "
        f"measured step {doc['step_s']:.3f} s over {transfers} predicted disk transfers")))
    return latency


def fit_runtime_costs(docs: list[dict], configs) -> tuple[float, float]:
    """StarPU's cost per disk transfer (``runtime_latency``) and per disk transfer and tile held in main memory
    (``walk_s``) that best make the forecasts of ``docs`` (out_of_core.py's JSON, one per configuration) equal
    their measured steps, least squares with both >= 0, stored with the local machine's disk node; returns
    them (s). The forecast is taken as linear in the two costs about the ones it was made with."""
    from dataclasses import replace

    from scipy.optimize import nnls

    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.disk_node import save_disk, stored_disk

    from tilecast.executor.memory_limit import limit_prefetches

    machine = load_machine("local")
    disk = stored_disk(machine)
    prefetch = limit_prefetches()  # without prefetches the walks cost nothing: only the cost per transfer is fitted
    n = np.array([d["predicted_disk_writes"] + d["predicted_disk_reads"] for d in docs], float)
    w = n * np.array([d["predicted_resident_per_transfer"] for d in docs], float) * prefetch
    base = np.array([d["predicted_step_s"] for d in docs]) - disk.runtime_latency * n - disk.walk_s * w
    rel = np.array([d["step_s"] for d in docs])  # relative errors weigh each configuration alike
    cols = [n, w] if prefetch else [n]
    x, _ = nnls(np.stack(cols, axis=1) / rel[:, None], (rel - base) / rel)
    latency, walk = float(x[0]), float(x[1]) if prefetch else disk.walk_s
    names = ", ".join(f"{c[0]}:{c[1]}" + (f":{c[2]}" if c[2] != "none" else "") for c in configs)
    save_disk(machine, replace(disk, worker_costs={}, worker_costs_source="", worker_costs_by_workers={},
                               runtime_latency=latency, walk_s=walk,
                               runtime_source=(
        f"fitted: out_of_core.py {docs[0]['model']} {docs[0]['batch']}x{docs[0]['seq']} on {names}, "
        + ("with StarPU's prefetches (per transfer, and per transfer and tile in memory)" if prefetch else
           f"without prefetches (per transfer; walk_s kept from: {disk.runtime_source})"))))
    return latency, walk


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2-tiny")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--configs", default="32:2MiB,32:4MiB,32:8MiB,64:4MiB,64:6MiB,64:12MiB",
                    help="comma-separated TILE:LIMIT[:RECOMPUTE]")
    ap.add_argument("--sched", default="dmda")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--fit-first", action="store_true",
                    help="fit StarPU's cost per disk transfer on the first configuration's first run (see above)")
    ap.add_argument("--fit", type=int, default=0, metavar="N",
                    help="fit StarPU's cost per disk transfer and per transfer and tile in main memory on the first "
                         "N configurations' first runs (N >= 2; the others are forecast out of sample)")
    args = ap.parse_args()
    if args.fit and (args.fit < 2 or args.fit_first):
        print("memory_forecast: --fit: N must be >= 2, and --fit excludes --fit-first", file=sys.stderr)
        return 2
    configs = parse_configs(args.configs)
    runs: dict = {c: [] for c in configs}
    fitted = None
    for _ in range(args.repeats):
        for c in configs:
            runs[c].append(run_one(args, *c))
            if args.fit and fitted is None and c == configs[min(args.fit, len(configs)) - 1]:
                fitted = fit_runtime_costs([runs[k][0] for k in configs[:args.fit]], configs[:args.fit])
                print(f"fitted StarPU's costs: {fitted[0] * 1e6:.0f} us per disk transfer + {fitted[1] * 1e9:.1f} ns "
                      f"per tile in main memory", file=sys.stderr, flush=True)
            if args.fit_first and fitted is None:
                fitted = fit_runtime_latency(runs[c][0], c)
                print(f"fitted StarPU's cost per disk transfer on {c[0]}:{c[1]}: {fitted * 1e6:.0f} us",
                      file=sys.stderr, flush=True)
    rows = []
    print(f"\n{'tiling':>7}{'limit':>8}{'recomp':>10}{'pred s':>9}{'meas s':>9}{'err':>7}"
          f"{'pred wr MiB':>13}{'meas wr MiB':>13}{'pred rd MiB':>13}{'meas rd MiB':>13}")
    for (tile, limit, rc), docs in runs.items():
        steps = [d["step_s"] for d in docs]
        meas = float(np.median(steps))
        pred = docs[-1]["predicted_step_s"]  # the last forecast (after --fit-first, the fitted one)
        wr = float(np.median([d["disk_bytes"]["written"] for d in docs]))
        rd = float(np.median([d["disk_bytes"]["read"] for d in docs]))
        pw, pr = docs[-1]["predicted_disk_bytes"]["written"], docs[-1]["predicted_disk_bytes"]["read"]
        rows.append({"tiling": tile, "limit": limit, "recompute": rc, "predicted_step_s": pred,
                     "measured_step_s": meas, "repeats_step_s": steps,
                     "predicted_disk_bytes": {"written": pw, "read": pr}, "disk_bytes": {"written": wr, "read": rd},
                     "predicted_evictions": docs[-1]["predicted_evictions"], "tasks": docs[0]["tasks"]})
        print(f"{tile:>7}{limit:>8}{rc:>10}{pred:>9.3f}{meas:>9.3f}{100 * (pred - meas) / meas:>+6.0f}%"
              f"{pw / 2**20:>13.1f}{wr / 2**20:>13.1f}{pr / 2**20:>13.1f}{rd / 2**20:>13.1f}")
    fit_names = [":".join(c) for c in configs[:args.fit]] if args.fit else [":".join(configs[0])] if fitted else []
    for r, c in zip(rows, configs):
        r["fitted"] = ":".join(c) in fit_names  # a fitted row is no validation figure
    print(json.dumps({"fitted_runtime_latency_s": fitted[0] if isinstance(fitted, tuple) else fitted,
                      "fitted_walk_s": fitted[1] if isinstance(fitted, tuple) else None,
                      "fitted_on": ",".join(fit_names) or None,
                      "model": args.model, "batch": args.batch, "seq": args.seq, "sched": args.sched,
                      "workers": args.workers, "steps": args.steps, "repeats": args.repeats, "rows": rows,
                      "conditions": next(iter(runs.values()))[0]["conditions"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
