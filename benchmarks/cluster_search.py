"""Speed of the cluster what-if: one 3072-GPU configuration, and a layout search.

Prints a table, then one JSON object with the same figures (last line).
Run from the repository root: python3 benchmarks/cluster_search.py [--configs 1000]
"""

import argparse
import json
import time

from tilecast.cluster.evaluate import evaluate
from tilecast.cluster.hardware import load_cluster
from tilecast.cluster.search import candidates
from tilecast.cluster.strategy import Strategy
from tilecast.graph.model_config import load_model
from tilecast.perfmodel.local import conditions_line, run_conditions


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", type=int, default=1000)
    args = ap.parse_args()
    conditions = run_conditions()
    print(conditions_line(conditions))
    c = load_cluster("dgx-a100")
    shape = load_model("gpt3-175b")
    st = Strategy(tp=8, pp=16, dp=24, seq=2048, global_batch=1536, recompute="selective", sequence_parallel=True,
                  schedule="interleaved", virtual_stages=2)
    t0 = time.process_time()
    r = evaluate(shape, st, c)
    one = time.process_time() - t0
    # every candidate layout (fitting or not) for 175B on 3072 GPUs, then 70B on 1024, until --configs are done
    cands = candidates(shape, c, 3072, 2048, 1536) + candidates(load_model("mpt-70b"), c, 1024, 2048, 1024)
    cands = (cands * (1 + args.configs // max(1, len(cands))))[: args.configs]
    shapes = {}
    t0 = time.process_time()
    tasks = 0
    for s in cands:
        name = "gpt3-175b" if s.gpus == 3072 else "mpt-70b"
        shapes.setdefault(name, load_model(name))
        tasks += evaluate(shapes[name], s, c).n_tasks
    many = time.process_time() - t0
    print(f"{'what':<40} {'CPU s':>8} {'tasks':>9}")
    print(f"{'one 3072-GPU configuration':<40} {one:>8.3f} {r.n_tasks:>9}")
    print(f"{f'{len(cands)} configurations (search space)':<40} {many:>8.2f} {tasks:>9}")
    print(json.dumps({"one_config_3072_gpus_cpu_s": one, "one_config_tasks": r.n_tasks, "configs": len(cands),
                      "configs_cpu_s": many, "configs_tasks": tasks, "conditions": conditions}))


if __name__ == "__main__":
    main()
