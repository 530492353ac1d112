"""Dependency inference, exactly as a sequential-task-flow runtime (StarPU) derives it.

For each tile, accesses are taken in submission order: a reader depends on the
last writer (read after write); a writer depends on every reader since the last
writer (write after read) or, if there was none, on the last writer itself
(write after write). Vectorised with numpy: no Python loop over tasks.
"""

from __future__ import annotations

import numpy as np


def infer_dependencies(acc_ptr: np.ndarray, acc_tile: np.ndarray, acc_mode: np.ndarray):
    """Return (pred_ptr, pred): CSR lists of each task's direct predecessors, sorted."""
    n_tasks = len(acc_ptr) - 1
    counts = np.diff(acc_ptr)
    acc_task = np.repeat(np.arange(n_tasks, dtype=np.int64), counts)
    order = np.lexsort((acc_task, acc_tile))
    tile = acc_tile[order]
    task = acc_task[order]
    is_w = (acc_mode[order] & 2) != 0
    del order, acc_task
    n = len(tile)
    if n == 0:
        return np.zeros(n_tasks + 1, np.int64), np.zeros(0, np.int32)
    idx = np.arange(n, dtype=np.int64)
    new_seg = np.empty(n, dtype=bool)
    new_seg[0] = True
    np.not_equal(tile[1:], tile[:-1], out=new_seg[1:])
    seg_start = np.maximum.accumulate(np.where(new_seg, idx, 0))
    end_flag = np.empty(n, dtype=bool)
    end_flag[-1] = True
    end_flag[:-1] = new_seg[1:]
    seg_end = np.minimum.accumulate(np.where(end_flag, idx, n)[::-1])[::-1]

    last_w = np.maximum.accumulate(np.where(is_w, idx, -1))
    last_w_before = np.empty(n, dtype=np.int64)
    last_w_before[0] = -1
    last_w_before[1:] = last_w[:-1]
    next_w = np.minimum.accumulate(np.where(is_w, idx, n)[::-1])[::-1]
    next_w_after = np.empty(n, dtype=np.int64)
    next_w_after[-1] = n
    next_w_after[:-1] = next_w[1:]

    reads = ~is_w
    raw = reads & (last_w_before >= seg_start)
    war = reads & (next_w_after <= seg_end)
    prev = idx - 1
    waw = is_w & ~new_seg
    waw[1:] &= is_w[:-1]

    src = np.concatenate((last_w_before[raw], idx[war], prev[waw]))
    dst = np.concatenate((idx[raw], next_w_after[war], idx[waw]))
    src_task = task[src]
    dst_task = task[dst]
    keep = src_task != dst_task
    key = np.unique(dst_task[keep] * n_tasks + src_task[keep])
    dst_task = key // n_tasks
    pred = (key - dst_task * n_tasks).astype(np.int32)
    pred_ptr = np.zeros(n_tasks + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst_task, minlength=n_tasks), out=pred_ptr[1:])
    return pred_ptr, pred
