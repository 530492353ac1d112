"""Vectorised DAG helpers: successors, topological levels, longest paths.

Graphs have millions of tasks, so these work level by level with numpy (one
batch of array operations per level of the DAG), never a Python loop per task.
Tasks are in submission order, so every predecessor has a smaller id.
"""

from __future__ import annotations

import numpy as np


def successors(pred_ptr: np.ndarray, pred: np.ndarray, n_tasks: int) -> tuple[np.ndarray, np.ndarray]:
    """(succ_ptr, succ): the transpose of the predecessor CSR, successors sorted by id."""
    dst = np.repeat(np.arange(n_tasks, dtype=np.int64), np.diff(pred_ptr))
    src = np.asarray(pred, dtype=np.int64)
    order = np.lexsort((dst, src))
    succ = dst[order].astype(np.int32)
    succ_ptr = np.zeros(n_tasks + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n_tasks), out=succ_ptr[1:])
    return succ_ptr, succ


def levels(pred_ptr: np.ndarray, pred: np.ndarray, n_tasks: int) -> np.ndarray:
    """Topological level of every task: 0 for sources, else 1 + the deepest predecessor.

    Raises ValueError when the predecessor lists contain a cycle.
    """
    pred_ptr = np.asarray(pred_ptr, dtype=np.int64)
    succ_ptr, succ = successors(pred_ptr, pred, n_tasks)
    indeg = np.diff(pred_ptr).astype(np.int64)
    level = np.full(n_tasks, -1, dtype=np.int64)
    frontier = np.flatnonzero(indeg == 0)
    depth = 0
    done = 0
    while len(frontier):
        level[frontier] = depth
        done += len(frontier)
        starts, ends = succ_ptr[frontier], succ_ptr[frontier + 1]
        counts = ends - starts
        if counts.sum() == 0:
            break
        idx = np.repeat(ends - counts.cumsum(), counts) + np.arange(counts.sum())
        targets = succ[idx]
        hit, n_hit = np.unique(targets, return_counts=True)
        indeg[hit] -= n_hit
        frontier = hit[indeg[hit] == 0]
        depth += 1
    if done != n_tasks:
        raise ValueError(f"dependencies contain a cycle ({n_tasks - done} tasks never become ready)")
    return level


def _by_level(level: np.ndarray):
    order = np.argsort(level, kind="stable")
    bounds = np.searchsorted(level[order], np.arange(level.max() + 2 if len(level) else 1))
    return order, bounds


def longest_path_end(duration: np.ndarray, pred_ptr: np.ndarray, pred: np.ndarray,
                     level: np.ndarray | None = None) -> np.ndarray:
    """Earliest finish of every task with unlimited workers: duration + latest predecessor finish."""
    n = len(duration)
    if n == 0:
        return np.zeros(0)
    pred_ptr = np.asarray(pred_ptr, dtype=np.int64)
    if level is None:
        level = levels(pred_ptr, pred, n)
    order, bounds = _by_level(level)
    finish = np.zeros(n, dtype=np.float64)
    counts_all = np.diff(pred_ptr)
    for lv in range(len(bounds) - 1):
        ids = order[bounds[lv]:bounds[lv + 1]]
        counts = counts_all[ids]
        ready = np.zeros(len(ids))
        has = counts > 0
        if has.any():
            ids_h, c = ids[has], counts[has]
            idx = np.repeat(pred_ptr[ids_h + 1] - c.cumsum(), c) + np.arange(c.sum())
            starts = np.concatenate(([0], c.cumsum()[:-1]))
            ready[has] = np.maximum.reduceat(finish[pred[idx]], starts)
        finish[ids] = ready + duration[ids]
    return finish


def bottom_level(duration: np.ndarray, pred_ptr: np.ndarray, pred: np.ndarray,
                 level: np.ndarray | None = None) -> np.ndarray:
    """Longest path from the start of each task to the end of the graph (HEFT's upward rank)."""
    n = len(duration)
    if n == 0:
        return np.zeros(0)
    succ_ptr, succ = successors(pred_ptr, pred, n)
    if level is None:
        level = levels(pred_ptr, pred, n)
    order, bounds = _by_level(level)
    bl = np.zeros(n, dtype=np.float64)
    counts_all = np.diff(succ_ptr)
    for lv in range(len(bounds) - 2, -1, -1):
        ids = order[bounds[lv]:bounds[lv + 1]]
        counts = counts_all[ids]
        after = np.zeros(len(ids))
        has = counts > 0
        if has.any():
            ids_h, c = ids[has], counts[has]
            idx = np.repeat(succ_ptr[ids_h + 1] - c.cumsum(), c) + np.arange(c.sum())
            starts = np.concatenate(([0], c.cumsum()[:-1]))
            after[has] = np.maximum.reduceat(bl[succ[idx]], starts)
        bl[ids] = after + duration[ids]
    return bl
