"""Speed of the cluster what-if: the first 3072-GPU layout evaluated in a fresh process, and a layout search.

Each run is a fresh Python process (this file with ``--child``): it imports tilecast, loads the cluster
and the model, then times (CPU time of the process, ``time.process_time``) the first layout it
evaluates, the same layout again, and the search of ``--configs`` layouts. ``--baseline REV`` runs
``REV``'s tilecast in the same way, alternating with this tree's, so that both see the same minutes.

Prints the CPU model and load average, a table, then one JSON object with the same figures (last line).
Run from the repository root: python3 benchmarks/cluster_search.py [--configs 1000] [--runs 3] [--baseline REV]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_FIRST_S = 0.05
TARGET_SEARCH_S = 10.0


def measure(configs: int) -> dict:
    """In this (fresh) process: imports, the first layout, the same again, then ``configs`` layouts."""
    from tilecast.cluster.evaluate import evaluate
    from tilecast.cluster.hardware import load_cluster
    from tilecast.cluster.search import candidates
    from tilecast.cluster.strategy import Strategy
    from tilecast.graph.model_config import load_model

    c = load_cluster("dgx-a100")
    shape = load_model("gpt3-175b")
    st = Strategy(tp=8, pp=16, dp=24, seq=2048, global_batch=1536, recompute="selective", sequence_parallel=True,
                  schedule="interleaved", virtual_stages=2)
    setup = time.process_time()  # imports and loading, since the process started
    t0 = time.process_time()
    r = evaluate(shape, st, c)
    first = time.process_time() - t0
    t0 = time.process_time()
    evaluate(shape, st, c)
    again = time.process_time() - t0
    # every candidate layout (fitting or not) for 175B on 3072 GPUs, then 70B on 1024, until `configs` are done
    cands = candidates(shape, c, 3072, 2048, 1536) + candidates(load_model("mpt-70b"), c, 1024, 2048, 1024)
    cands = (cands * (1 + configs // max(1, len(cands))))[:configs]
    shapes = {}
    t0 = time.process_time()
    tasks = 0
    for s in cands:
        name = "gpt3-175b" if s.gpus == 3072 else "mpt-70b"
        shapes.setdefault(name, load_model(name))
        tasks += evaluate(shapes[name], s, c).n_tasks
    many = time.process_time() - t0
    return {"setup_cpu_s": setup, "one_config_3072_gpus_cpu_s": first, "again_cpu_s": again,
            "one_config_tasks": r.n_tasks, "step_s": r.step_s, "configs": len(cands), "configs_cpu_s": many,
            "configs_tasks": tasks}


def source_tree(rev: str, into: Path) -> Path:
    """``rev``'s tilecast package, unpacked under ``into``."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "tilecast"], check=False, capture_output=True)
    if archive.returncode != 0:
        sys.exit(f"cluster_search: --baseline {rev}: {archive.stderr.decode().strip() or 'git archive failed'}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def run_child(tree: Path, configs: int) -> dict:
    """One fresh process with ``tree``'s tilecast first on the path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    load = os.getloadavg()[0]
    res = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", "--configs", str(configs)],
                         env=env, check=False, capture_output=True, text=True, cwd=tree)
    if res.returncode != 0:
        sys.exit(f"cluster_search: the run in {tree} failed:\n{res.stderr.strip()[-2000:]}")
    return dict(json.loads(res.stdout.strip().splitlines()[-1]), load_average=load)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=1, help="fresh processes per tree")
    ap.add_argument("--baseline", metavar="REV", help="also run this git revision's tilecast, alternating")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.configs < 1 or args.runs < 1:
        ap.exit(2, "cluster_search: --configs and --runs must be >= 1\n")
    if args.child:
        print(json.dumps(measure(args.configs)))
        return
    sys.path.insert(0, str(REPO))
    from tilecast.perfmodel.local import cpu_count, cpu_model

    conditions = {"cpu": cpu_model(), "cores": cpu_count(), "load_average_start": os.getloadavg()[0]}
    print(f"CPU {conditions['cpu']} ({conditions['cores']} cores); load average {conditions['load_average_start']:.2f}")
    trees = {"this tree": REPO}
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline:
            trees[args.baseline] = source_tree(args.baseline, Path(tmp))
        rows = [dict(run_child(tree, args.configs), tree=name, run=i + 1)
                for i in range(args.runs) for name, tree in trees.items()]
    conditions["load_average_end"] = os.getloadavg()[0]
    print(f"{'tree':<12} {'run':>3} {'load':>5} {'imports s':>9} {'first s':>8} {'again s':>8} "
          f"{'search s':>9} {'tasks':>6}")
    for r in rows:
        print(f"{r['tree']:<12} {r['run']:>3} {r['load_average']:>5.2f} {r['setup_cpu_s']:>9.3f} "
              f"{r['one_config_3072_gpus_cpu_s']:>8.3f} {r['again_cpu_s']:>8.3f} {r['configs_cpu_s']:>9.2f} "
              f"{r['one_config_tasks']:>6}")
    print(f"(CPU s of each fresh process; first: the first layout it evaluates, target {TARGET_FIRST_S} s; "
          f"search: {rows[0]['configs']} layouts, {rows[0]['configs_tasks']} tasks, target {TARGET_SEARCH_S:g} s)")
    ours = rows[0]
    print(json.dumps({"one_config_3072_gpus_cpu_s": ours["one_config_3072_gpus_cpu_s"],
                      "one_config_tasks": ours["one_config_tasks"], "configs": ours["configs"],
                      "configs_cpu_s": ours["configs_cpu_s"], "configs_tasks": ours["configs_tasks"],
                      "runs": rows, "conditions": conditions}))


if __name__ == "__main__":
    main()
