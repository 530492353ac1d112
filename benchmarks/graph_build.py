"""Build the gpt2-xl training step (batch 8, sequence 1024, every tile 256) and time it.

Prints task count, build time, tasks per second and peak resident memory per
task (growth of the process's peak RSS over its size before the build), for
the build alone and for the build followed by dependency inference, then the
wall time of the whole ``tilecast graph --no-compare`` command (a fresh
process: imports, build, dependencies, flops, live memory, critical path) on
the 2-million-task step at tile 128. Every figure is measured in a fresh
process, ``--rounds`` times, and the median reported, in wall-clock time and
in the process's CPU time (``time.process_time``; for the command, the
child's user + system time): on a machine shared with other work the CPU
figures are the steadier ones.

``--baseline REV`` also runs git revision ``REV``'s source tree (``git
archive``), the two trees taking turns round by round in the same run, so that
the machine's load hits both alike; ``speedup`` is baseline / current.

Targets: >= 400,000 tasks/s and <= 300 bytes of peak memory per task for the
build, the ``tilecast graph`` command under 5 s.

    python3 benchmarks/graph_build.py [--model gpt2-xl --batch 8 --seq 1024 --tile 256] [--rounds 3]
        [--command-tile 128 | --no-command] [--baseline main]

Last line: one JSON object; ``build_s``, ``build_cpu_s``, ``deps_s``,
``command_s``, ``command_cpu_s`` in seconds (medians), ``tasks_per_s`` and
``tasks_per_cpu_s`` (tasks over the median build time), ``peak_bytes_per_task``
(bytes), with a baseline the same keys under ``baseline`` and ``speedup``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TARGET_TASKS_PER_S = 400_000
TARGET_BYTES_PER_TASK = 300
TARGET_COMMAND_S = 5.0
REPO = Path(__file__).resolve().parents[1]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def graph_bytes(g) -> int:
    arrays = [g.kernel, g.tag, g.param_ptr, g.params, g.acc_ptr, g.acc_tile, g.acc_mode, g.tile_tensor,
              g.tile_nbytes]
    return sum(a.nbytes for a in arrays)


def measure_build(model: str, batch: int, seq: int, tile: str) -> dict:
    """One build and dependency inference in this process (the tilecast on ``sys.path``)."""
    from tilecast.graph import Tiling
    from tilecast.graph.gpt2 import build_gpt2_step
    from tilecast.graph.model_config import load_model

    cfg, tiling = load_model(model), Tiling.parse(tile)
    build_gpt2_step(load_model("gpt2-tiny"), 1, 4, Tiling())  # warm imports and registry
    gc.collect()
    base = rss_bytes()
    c0, t0 = time.process_time(), time.perf_counter()
    g = build_gpt2_step(cfg, batch, seq, tiling)
    build_s, build_cpu = time.perf_counter() - t0, time.process_time() - c0
    peak_build = peak_rss_bytes() - base
    c0, t0 = time.process_time(), time.perf_counter()
    ptr, pred = g.dependencies
    deps_s, deps_cpu = time.perf_counter() - t0, time.process_time() - c0
    peak_deps = peak_rss_bytes() - base
    return {"tasks": int(g.n_tasks), "dependencies": len(pred), "build_s": build_s, "build_cpu_s": build_cpu,
            "peak_build": peak_build, "deps_s": deps_s, "deps_cpu_s": deps_cpu, "peak_deps": peak_deps,
            "held": graph_bytes(g) + ptr.nbytes + pred.nbytes, "tiling": tiling.describe(), "model": cfg.name}


def source_tree(rev: str, into: Path) -> Path:
    """``rev``'s tilecast package, unpacked under ``into``."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "tilecast"], check=False, capture_output=True)
    if archive.returncode != 0:
        sys.exit(f"graph_build: --baseline {rev}: {archive.stderr.decode().strip() or 'git archive failed'}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def in_tree(tree: Path, argv: list) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run ``python3 argv`` with ``tree`` first on the path: (result, wall s, the child's CPU s)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, *argv], env=env, check=False, capture_output=True, text=True, cwd=tree)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if res.returncode != 0:
        sys.exit(f"graph_build: {' '.join(argv[:3])} ... failed in {tree}:\n{res.stderr.strip()[-2000:]}")
    return res, wall, cpu


def one_build(tree: Path, args) -> dict:
    res, _, _ = in_tree(tree, [str(Path(__file__).resolve()), "--measure-build", "--model", args.model,
                               "--batch", str(args.batch), "--seq", str(args.seq), "--tile", args.tile])
    return json.loads(res.stdout.strip().splitlines()[-1])


def one_command(tree: Path, args) -> dict:
    _, wall, cpu = in_tree(tree, ["-m", "tilecast", "graph", "--model", args.model, "--batch", str(args.batch),
                                  "--seq", str(args.seq), "--tile", args.command_tile, "--no-compare", "--json"])
    return {"command_s": wall, "command_cpu_s": cpu}


def medians(runs: list[dict]) -> dict:
    out = dict(runs[0])
    for key in runs[0]:
        if key.endswith("_s") or key.startswith("peak") or key == "held":
            out[key] = float(np.median([r[key] for r in runs]))
    n = out["tasks"]
    out.update(tasks_per_s=n / out["build_s"], tasks_per_cpu_s=n / out["build_cpu_s"],
               peak_bytes_per_task=out["peak_build"] / n, peak_bytes_per_task_with_deps=out["peak_deps"] / n,
               held_bytes_per_task=out["held"] / n, deps_tasks_per_s=n / out["deps_s"])
    return out


def print_rows(name: str, m: dict, command: bool) -> None:
    rows = [
        ("tasks", f"{m['tasks']:,}"),
        ("dependencies", f"{m['dependencies']:,}"),
        ("build time", f"{m['build_s']:.3f} s wall, {m['build_cpu_s']:.3f} s CPU"),
        ("build rate", (f"{m['tasks_per_s']:,.0f} tasks/s wall, {m['tasks_per_cpu_s']:,.0f} per CPU second "
                        f"(target >= {TARGET_TASKS_PER_S:,})")),
        ("peak memory / task, build", f"{m['peak_bytes_per_task']:.0f} B (target <= {TARGET_BYTES_PER_TASK})"),
        ("dependency inference", (f"{m['deps_s']:.3f} s wall, {m['deps_cpu_s']:.3f} s CPU "
                                  f"({m['deps_tasks_per_s']:,.0f} tasks/s)")),
        ("peak memory / task, build + deps", f"{m['peak_bytes_per_task_with_deps']:.0f} B"),
        ("graph arrays held / task", f"{m['held_bytes_per_task']:.0f} B"),
    ]
    if command:
        rows.append(("tilecast graph --no-compare", (f"{m['command_s']:.2f} s wall, {m['command_cpu_s']:.2f} s CPU "
                                                     f"(target < {TARGET_COMMAND_S:.0f} s)")))
    print(name)
    for k, v in rows:
        print(f"  {k:<34}{v}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2-xl")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--tile", default="256", help="tiling of the timed build (default 256)")
    ap.add_argument("--command-tile", default="128", help="tiling of the timed `tilecast graph` (default 128)")
    ap.add_argument("--no-command", action="store_true", help="do not time the `tilecast graph` command")
    ap.add_argument("--rounds", type=int, default=3, help="fresh processes per figure; medians (default 3)")
    ap.add_argument("--baseline", metavar="REV", help="git revision to run side by side, round by round")
    ap.add_argument("--measure-build", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure_build:
        print(json.dumps(measure_build(args.model, args.batch, args.seq, args.tile)))
        return
    if args.rounds < 1:
        ap.error(f"--rounds: at least 1, got {args.rounds}")
    from tilecast.perfmodel.local import conditions_line, run_conditions

    conditions = run_conditions()
    print(conditions_line(conditions))
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="tilecast-baseline-") as tmp:
        trees = {"current": REPO}
        if args.baseline:
            trees["baseline"] = source_tree(args.baseline, Path(tmp))
        runs = {name: [] for name in trees}
        for r in range(args.rounds):
            for name, tree in trees.items():
                m = one_build(tree, args)
                if not args.no_command:
                    m.update(one_command(tree, args))
                runs[name].append(m)
                print(f"  round {r + 1} {name}: build {m['build_s']:.3f} s ({m['build_cpu_s']:.3f} CPU)"
                      + ("" if args.no_command else f", graph {m['command_s']:.2f} s ({m['command_cpu_s']:.2f} CPU)"),
                      file=sys.stderr)
    load_after = os.getloadavg()
    res = {name: medians(rs) for name, rs in runs.items()}
    cur = res["current"]
    print(f"{cur['model']}, batch {args.batch} x {args.seq}, tiling {cur['tiling']}; `tilecast graph` at tile "
          f"{args.command_tile}; medians of {args.rounds} fresh processes; load average {load_before[0]:.1f} "
          f"before, {load_after[0]:.1f} after (2 cores: above 2, wall-clock figures include waiting)")
    for name, m in res.items():
        print_rows(name + (f" ({args.baseline})" if name == "baseline" else ""), m, not args.no_command)
    keys = ("build_s", "build_cpu_s", "deps_s", "deps_cpu_s") + (() if args.no_command else ("command_s", "command_cpu_s"))
    out = {k: v for k, v in cur.items() if k not in ("peak_build", "peak_deps", "held")}
    met = cur["tasks_per_s"] >= TARGET_TASKS_PER_S and cur["peak_bytes_per_task"] <= TARGET_BYTES_PER_TASK
    if not args.no_command:
        met = met and cur["command_s"] < TARGET_COMMAND_S
    if args.baseline:
        base = res["baseline"]
        speedup = {k: base[k] / cur[k] for k in keys}
        print("speedup (baseline / current): " + ", ".join(f"{k} {v:.2f}x" for k, v in speedup.items()))
        out["baseline"] = {k: v for k, v in base.items() if k not in ("peak_build", "peak_deps", "held")}
        out["baseline"]["revision"] = args.baseline
        out["speedup"] = speedup
    print(json.dumps({**out, "batch": args.batch, "seq": args.seq, "command_tiling": args.command_tile,
                      "rounds": args.rounds, "targets_met": bool(met), "load_average": [load_before[0], load_after[0]],
                      "conditions": conditions}))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
