"""DAG helpers: successors; bottom levels come from :mod:`tilecast.graph.priorities`.

Tasks are in submission order, so every predecessor has a smaller id and one
pass in id order (or its reverse) is a topological sweep. The sweeps are plain
Python over lists (about 0.5 us per task): a level-by-level numpy version pays
per level, and training-step graphs have thousands of levels. Earliest finishes
come from the graph package (``longest_path_end``), which the critical path of
``tilecast graph`` uses too.
"""

from __future__ import annotations

import numpy as np

from tilecast.graph.priorities import bottom_level  # noqa: F401  (one definition, shared with the executor)


def successors(pred_ptr: np.ndarray, pred: np.ndarray, n_tasks: int) -> tuple[np.ndarray, np.ndarray]:
    """(succ_ptr, succ): the transpose of the predecessor CSR, successors sorted by id."""
    dst = np.repeat(np.arange(n_tasks, dtype=np.int64), np.diff(pred_ptr))
    src = np.asarray(pred, dtype=np.int64)
    order = np.argsort(src, kind="stable")  # dst is already in increasing order
    succ = dst[order].astype(np.int32)
    succ_ptr = np.zeros(n_tasks + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n_tasks), out=succ_ptr[1:])
    return succ_ptr, succ
