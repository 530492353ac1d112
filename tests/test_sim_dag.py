"""DAG sweeps against a brute-force longest path."""

import numpy as np

from tilecast.graph.analysis import longest_path_end
from tilecast.simulator.dag import bottom_level, successors


def _random_dag(rng, n):
    preds = [sorted(set(rng.integers(0, i, size=rng.integers(0, min(i, 3) + 1)).tolist())) if i else []
             for i in range(n)]
    ptr = np.zeros(n + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(p) for p in preds])
    return preds, ptr, np.array([x for p in preds for x in p], dtype=np.int32)


def test_sweeps_match_brute_force():
    rng = np.random.default_rng(3)
    preds, ptr, pred = _random_dag(rng, 300)
    w = rng.uniform(0.1, 1.0, 300)
    finish = np.zeros(300)
    for i in range(300):
        finish[i] = w[i] + max((finish[j] for j in preds[i]), default=0.0)
    np.testing.assert_allclose(longest_path_end(w, ptr, pred), finish)
    succs = [[] for _ in range(300)]
    for i, p in enumerate(preds):
        for j in p:
            succs[j].append(i)
    bl = np.zeros(300)
    for i in range(299, -1, -1):
        bl[i] = w[i] + max((bl[j] for j in succs[i]), default=0.0)
    np.testing.assert_allclose(bottom_level(w, ptr, pred), bl)
    assert np.isclose(bl.max(), finish.max())  # the same critical path, seen from both ends
    sptr, succ = successors(ptr, pred, 300)
    assert [succ[sptr[i]:sptr[i + 1]].tolist() for i in range(300)] == succs
