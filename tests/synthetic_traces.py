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
