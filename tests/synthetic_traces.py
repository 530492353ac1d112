"""Hand-built traces with known schedules, for testing comparisons.

Two workers run tasks back to back (no gaps), so every makespan and busy time
follows from the durations by hand.
"""

import numpy as np

from tilecast.trace import make_trace

# (kernel, duration in ms, worker, tag); worker 0: 5 x (gemm 4 + add 1) = 25 ms, worker 1: 5 x softmax 1 = 5 ms.
BASE = []
for layer in range(5):
    BASE += [("gemm", 4.0, 0, f"h{layer}/mlp"), ("add", 1.0, 0, f"h{layer}/mlp"),
             ("softmax", 1.0, 1, f"h{layer}/attn")]


def schedule(source, scale=None, tasks=BASE):
    """A trace of ``tasks`` with each kernel's durations multiplied by ``scale[kernel]``."""
    scale = scale or {}
    clock = {}
    cols = {k: [] for k in ("task", "kernel", "worker", "start_s", "end_s", "tag")}
    for i, (kernel, ms, worker, tag) in enumerate(tasks):
        d = ms * 1e-3 * scale.get(kernel, 1.0)
        s = clock.get(worker, 0.0)
        clock[worker] = s + d
        for k, v in zip(cols, (i, kernel, worker, s, s + d, tag)):
            cols[k].append(v)
    return make_trace(**{k: np.array(v) for k, v in cols.items()}, node=0, bytes=0, flops=0.0, source=source)


def graph_schedule(graph, durations, workers, source):
    """A valid schedule of ``graph``: tasks in submission order, round robin over ``workers``,
    each starting once its worker is free and its predecessors (graph.dependencies) have ended."""
    from tilecast.kernels import all_kernels

    ptr, pred = graph.dependencies
    n = graph.n_tasks
    start, end = np.zeros(n), np.zeros(n)
    free = [0.0] * workers
    for i in range(n):
        w = i % workers
        ready = max((end[p] for p in pred[ptr[i]:ptr[i + 1]]), default=0.0)
        start[i] = max(free[w], ready)
        end[i] = free[w] = start[i] + durations[i]
    names = np.array([k.name for k in all_kernels()])[graph.kernel]
    return make_trace(task=np.arange(n), kernel=names, worker=np.arange(n) % workers, node=0, start_s=start,
                      end_s=end, bytes=graph.bytes, flops=graph.flops,
                      source=source, tag=np.array(graph.tags, dtype=object)[graph.tag])
