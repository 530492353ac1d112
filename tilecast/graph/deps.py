"""Dependency inference, exactly as a sequential-task-flow runtime (StarPU) derives it.

For each tile, accesses are taken in submission order: a reader depends on the
last writer (read after write); a writer depends on every reader since the last
writer (write after read) or, if there was none, on the last writer itself
(write after write). Vectorised with numpy: no Python loop over tasks. Indices
are int32 (a graph holds fewer than 2**31 accesses) to keep the peak small.
"""

from __future__ import annotations

import numpy as np


def _shift_right(a: np.ndarray, fill) -> np.ndarray:
    out = np.empty_like(a)
    out[0] = fill
    out[1:] = a[:-1]
    return out


def _shift_left(a: np.ndarray, fill) -> np.ndarray:
    out = np.empty_like(a)
    out[-1] = fill
    out[:-1] = a[1:]
    return out


def _sorted_unique(a: np.ndarray) -> np.ndarray:
    """``np.unique`` of an int64 array by an in-place sort (numpy 2's hash-based unique took
    6 s on the 6 M keys of a 2 M-task graph; this takes a fraction of a second)."""
    a.sort()
    if len(a) < 2:
        return a
    keep = np.empty(len(a), dtype=bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def _tile_order(acc_tile: np.ndarray) -> np.ndarray:
    """Access indices sorted by tile, accesses of one tile in submission order (a stable argsort), as int32.

    Sorts one int64 key per access, the tile in the high half and the index in the low one: the keys are
    distinct, so numpy's default (vectorised) sort orders them as a stable sort would, in about 60% of the
    time of a stable argsort of the tile ids on the 6 M accesses of a 2 M-task step."""
    key = np.asarray(acc_tile).astype(np.int64)
    key <<= 32
    key |= np.arange(len(key), dtype=np.int64)
    key.sort()
    return (key & 0xFFFFFFFF).astype(np.int32)


def infer_dependencies(acc_ptr: np.ndarray, acc_tile: np.ndarray, acc_mode: np.ndarray):
    """Return (pred_ptr, pred): CSR lists of each task's direct predecessors, sorted."""
    n_tasks = len(acc_ptr) - 1
    n = len(acc_tile)
    if n == 0:
        return np.zeros(n_tasks + 1, np.int64), np.zeros(0, np.int32)
    if n >= 2 ** 31 - 1:
        raise ValueError("graph too large: more than 2**31 accesses")
    i32 = np.int32
    acc_task = np.repeat(np.arange(n_tasks, dtype=i32), np.diff(acc_ptr))
    # Stable sort by tile; accesses of one tile stay in submission order.
    order = _tile_order(acc_tile)
    tile = acc_tile[order]
    task = acc_task[order]
    is_w = (acc_mode[order] & 2) != 0
    del order, acc_task
    idx = np.arange(n, dtype=i32)

    new_seg = np.empty(n, dtype=bool)
    new_seg[0] = True
    np.not_equal(tile[1:], tile[:-1], out=new_seg[1:])
    del tile
    seg_start = np.maximum.accumulate(np.where(new_seg, idx, i32(0)))
    last_w_before = _shift_right(np.maximum.accumulate(np.where(is_w, idx, i32(-1))), -1)
    reads = ~is_w
    raw = reads & (last_w_before >= seg_start)
    del seg_start
    src_raw, dst_raw = task[last_w_before[raw]], task[raw]
    del last_w_before, raw

    end_flag = _shift_left(new_seg, True)
    seg_end = np.minimum.accumulate(np.where(end_flag, idx, i32(n))[::-1])[::-1]
    del end_flag
    next_w_after = _shift_left(np.minimum.accumulate(np.where(is_w, idx, i32(n))[::-1])[::-1], n)
    war = reads & (next_w_after <= seg_end)
    src_war, dst_war = task[war], task[next_w_after[war]]
    del seg_end, next_w_after, war, reads

    waw = is_w & ~new_seg
    waw[1:] &= is_w[:-1]
    src_waw, dst_waw = task[idx[waw] - 1], task[waw]
    del waw, idx, new_seg, is_w, task

    # one int64 key per edge, destination in the high half: sorted, it orders edges by destination,
    # then source; both halves come back by a shift and a mask
    key = np.concatenate((dst_raw, dst_war, dst_waw)).astype(np.int64)
    key <<= 32
    key |= np.concatenate((src_raw, src_war, src_waw)).astype(np.int64)
    del src_raw, src_war, src_waw, dst_raw, dst_war, dst_waw
    key = key[(key >> 32) != (key & 0xFFFFFFFF)]
    key = _sorted_unique(key)
    pred = (key & 0xFFFFFFFF).astype(np.int32)
    pred_ptr = np.searchsorted(key, np.arange(n_tasks + 1, dtype=np.int64) << 32).astype(np.int64)
    return pred_ptr, pred


def successors(pred_ptr: np.ndarray, pred: np.ndarray, n_tasks: int) -> tuple[np.ndarray, np.ndarray]:
    """(succ_ptr, succ): the transpose of the predecessor CSR, successors sorted by id."""
    dst = np.repeat(np.arange(n_tasks, dtype=np.int64), np.diff(pred_ptr))
    src = np.asarray(pred, dtype=np.int64)
    order = np.argsort(src, kind="stable")  # dst is already in increasing order
    succ = dst[order].astype(np.int32)
    succ_ptr = np.zeros(n_tasks + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n_tasks), out=succ_ptr[1:])
    return succ_ptr, succ
