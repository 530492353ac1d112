"""Which shapes calibration times when timing every one would take longer than its budget.

The candidate tilings of a GPT-2-small-width step hold thousands of distinct
shapes (8,408 for the two and twelve layer GPT-2 and Llama steps of
``benchmarks/executor_vs_torch.py``), many of them alike in what a kernel's
duration depends on. When the estimated time to time them all exceeds the
budget, each kernel gets a share of it and a *design*: a subset of its shapes
that covers the range of the shape model's features
(:func:`tilecast.perfmodel.shape_model.shape_features`: flops, bytes, mode
flags), chosen as

1. one shape per set of equal features (the others get its time exactly);
2. the ends of the range: the smallest and largest flops and bytes (always
   timed, so the shape model interpolates and extrapolates only to shapes
   over the bound below), and at least as many shapes as the model needs to fit;
3. then, greedily, the shape farthest (in decades) from every shape timed so
   far, the calibration's earlier ones included, among those the share can
   still pay for, until no shape is more than :data:`MIN_GAP` from a timed one
   or :data:`MAX_PER_KERNEL` are chosen.

Shares are handed out cheapest kernel first, each taking at most an equal
part of what is left, so what a cheap kernel does not need goes to the
costly ones. Below the budget every shape is timed, as before.

Whatever the budget, a shape *over the bound* is never timed: one whose task
is estimated to run longer than :data:`MAX_TASK_S`, or whose buffers (on every
lane) would take more than :data:`MEMORY_SHARE` of the memory available
(:func:`over_bound`). The candidate tilings of a cluster-size model
(llama2-7b and up) hold such tiles, of hundreds of MB to GBs, whose timing
takes seconds to minutes each. They are left to the shape model, which
extrapolates them from the kernel's largest timed shapes: for such a kernel
the design also times its :data:`TOP_TIMED` largest affordable shapes, and
the extrapolation's error is measured by holding the largest of those out
(:func:`tilecast.perfmodel.shape_model.extrapolation_errors`).

A memory-bound kernel runs slower per byte once its buffers outgrow the
last-level cache (:mod:`tilecast.perfmodel.cache_regimes`); its shapes over the
bound lie far beyond it. Where such a kernel has no timed shape clear of the
cache (:data:`~tilecast.perfmodel.cache_regimes.CLEAR_OF_CACHE` times it),
:func:`past_cache` adds one: the kernel's affordable shape with the largest
buffers if those are clear of it, else (an elementwise kernel, whose buffers
are all of its ``n`` floats) its largest shape scaled to :data:`PAST_CACHE`
times the cache, tens of milliseconds of timing.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial import cKDTree

from tilecast.kernels import get
from tilecast.perfmodel.shape_model import MIN_FIT_POINTS, shape_features

MAX_PER_KERNEL = 40
MIN_GAP = 0.02  # decades (5% in flops or bytes): a shape this near a timed one is left to the shape model
# The bound on what is timed: a task estimated longer than MAX_TASK_S (a shape then costs seconds of timing:
# two tasks per lane and pass, four passes), or buffers of all lanes over MEMORY_SHARE of the available memory.
MAX_TASK_S = 0.5
MEMORY_SHARE = 0.125
# Largest affordable shapes timed for a kernel with shapes over the bound: the base of their extrapolation.
TOP_TIMED = 3
# A shape made for a memory-bound kernel with no timed shape clear of the last-level cache (past_cache): buffers
# this many times the cache's share, so that they stream from memory whatever else the cache holds.
PAST_CACHE = 4.0


def over_bound(task_s, need_bytes, available_bytes: float, max_task_s: float = MAX_TASK_S,
               share: float = MEMORY_SHARE) -> np.ndarray:
    """Which shapes are too long or too large to time: an estimated task of more than ``max_task_s``
    seconds, or buffers (``need_bytes``, every lane's) over ``share`` of ``available_bytes``."""
    return (np.asarray(task_s, dtype=np.float64) > max_task_s) | (
        np.asarray(need_bytes, dtype=np.float64) > share * float(available_bytes))


def largest(features: np.ndarray, n: int) -> list[int]:
    """Rows of the ``n`` largest shapes: by flops, then bytes (a kernel without flops: by bytes)."""
    return [int(i) for i in np.lexsort((features[:, 1], features[:, 0]))[::-1][:n]]


def design(features: np.ndarray, cost_s: np.ndarray, allowance_s: float, known: np.ndarray | None = None,
           cap: int = MAX_PER_KERNEL, top: int = 0) -> list[int]:
    """Rows of ``features`` (distinct) to time, in the order chosen: the ends (and the ``top`` largest
    shapes), then farthest first."""
    m = len(features)
    if m == 0:
        return []
    ends = [int(f(features[:, j])) for j in range(2) for f in (np.argmin, np.argmax)]
    ends = list(dict.fromkeys(ends + largest(features, top)))
    chosen = ends[:max(cap, 1)]
    spent = float(cost_s[chosen].sum())
    centres = features[chosen] if known is None or not len(known) else np.concatenate([known, features[chosen]])
    gap = cKDTree(centres).query(features)[0]
    taken = np.zeros(m, dtype=bool)
    taken[chosen] = True
    while len(chosen) < min(cap, m):
        # the shape model needs MIN_FIT_POINTS shapes to fit: those are timed whatever they cost
        ok = ~taken & (((spent + cost_s <= allowance_s) & (gap > MIN_GAP)) | (len(chosen) < MIN_FIT_POINTS))
        if not ok.any():
            break
        j = int(np.argmax(np.where(ok, gap, -1.0)))
        chosen.append(j)
        taken[j] = True
        spent += float(cost_s[j])
        gap = np.minimum(gap, np.linalg.norm(features - features[j], axis=1))
    return chosen


def choose_timed(cases, cost_s, budget_s: float | None, known: dict | None = None,
                 cap: int | None = None, over=None) -> tuple[list[int], list[int]]:
    """(indices of ``cases`` to time, indices left to the shape model) for an estimated ``cost_s`` each.

    ``known``: kernel name -> shapes the calibration has timed already (they
    count as covered). ``over``: a flag per case over the bound (:func:`over_bound`), never timed.
    Every other case is timed when their total fits ``budget_s``
    (None: no budget) and no kernel has more than ``cap`` cases; otherwise each
    kernel's design has at most ``cap`` shapes (default :data:`MAX_PER_KERNEL`), its :data:`TOP_TIMED`
    largest among them where the kernel has shapes over the bound.
    """
    cost_s = np.asarray(cost_s, dtype=np.float64)
    over = np.zeros(len(cases), dtype=bool) if over is None else np.asarray(over, dtype=bool)
    by_kernel: dict = {}
    for i, (name, _) in enumerate(cases):
        if not over[i]:
            by_kernel.setdefault(name, []).append(i)
    extrapolated = {name for (name, _), o in zip(cases, over) if o}
    over_cap = cap is not None and any(len(v) > cap for v in by_kernel.values())
    if (budget_s is None or cost_s[~over].sum() <= budget_s) and not over_cap:
        return [i for i in range(len(cases)) if not over[i]], [i for i in range(len(cases)) if over[i]]
    cap = cap if cap is not None else MAX_PER_KERNEL
    budget_s = float("inf") if budget_s is None else budget_s
    known = known or {}
    plans = []
    for name, idx in by_kernel.items():
        kid = get(name).id
        z = shape_features(kid, np.asarray([cases[i][1] for i in idx], dtype=np.float64))
        keys, first, group = np.unique(z, axis=0, return_index=True, return_inverse=True)
        rep_cost = cost_s[np.asarray(idx)[first]]
        have = known.get(name)
        have = shape_features(kid, np.asarray(have, dtype=np.float64)) if have is not None and len(have) else None
        plans.append((float(rep_cost.sum()), name, np.asarray(idx), keys, first, rep_cost, have))
    plans.sort(key=lambda p: p[0])
    left, timed = float(budget_s), []
    for j, (_, name, idx, keys, first, rep_cost, have) in enumerate(plans):
        share = left / (len(plans) - j)
        rows = design(keys, rep_cost, share, have, cap, TOP_TIMED if name in extrapolated else 0)
        left = max(0.0, left - float(rep_cost[rows].sum()))
        timed += [int(idx[first[r]]) for r in rows]
    chosen = set(timed)
    return timed, [i for i in range(len(cases)) if i not in chosen]


def scaled_case(name: str, row, factor: float):
    """``row`` of kernel ``name`` with its work ``factor`` times larger, or None where the registry does not
    say how its buffers follow its parameters: only kernels whose every buffer holds ``n`` floats (AdamW, the
    elementwise kernels) are scaled, ``n`` and each buffer together."""
    k = get(name)
    row = np.asarray(row, dtype=np.float64)
    if "n" not in k.params:
        return None
    j = k.params.index("n")
    n = row[j]
    if n <= 0 or not np.all(row[len(k.params):] == 4 * n):
        return None
    out = row.copy()
    out[j] = np.ceil(n * factor)
    out[len(k.params):] = 4 * out[j]
    return out


def past_cache(cases, over, timed, caches, known: dict | None = None) -> tuple[list[int], list]:
    """(indices of ``cases`` to time as well, new cases to time) so that every kernel with memory-bound shapes
    over the bound (``over``) clear of the last-level cache (``caches``, a
    :class:`tilecast.perfmodel.cache_regimes.CacheRegimes`: :meth:`~CacheRegimes.clear_of_cache`) has a timed
    shape clear of it: among ``timed`` (indices chosen), ``known`` (kernel -> shapes timed before), else its
    affordable case with the largest buffers where those are clear of it, else its largest case scaled
    (:func:`scaled_case`) to :data:`PAST_CACHE` times the cache. The caller checks that a new case is itself
    under the bound."""
    from tilecast.perfmodel.cache_regimes import working_set

    if caches is None or not caches.bounds:
        return [], []
    llc = float(caches.bounds[-1])
    over = np.asarray(over, dtype=bool)
    chosen = set(int(i) for i in timed)
    add, made = [], []
    for name in sorted({name for (name, _), o in zip(cases, over) if o}):
        kid = get(name).id
        idx = [i for i, (n, _) in enumerate(cases) if n == name]
        rows = np.asarray([cases[i][1] for i in idx], dtype=np.float64)
        ws = working_set(kid, rows)
        clear = caches.clear_of_cache(ws)
        big = np.asarray([over[i] for i in idx]) & clear & caches.memory_bound(kid, rows)
        if not big.any():
            continue
        have = (known or {}).get(name)
        have = None if have is None or not len(have) else np.asarray(have, dtype=np.float64)
        if have is not None and caches.clear_of_cache(working_set(kid, have)).any():
            continue
        mine = np.asarray([i in chosen for i in idx])
        if (mine & clear).any():
            continue
        under = np.flatnonzero(~np.asarray([over[i] for i in idx]))
        if len(under) and clear[under].any():
            add.append(idx[int(under[np.argmax(ws[under])])])
            continue
        if len(under):
            top = under[np.argmax(ws[under])]
            row = scaled_case(name, rows[top], PAST_CACHE * llc / max(ws[top], 1.0))
            if row is not None:
                made.append((name, row))
    return add, made
