"""Task priorities and StarPU footprints: one definition for the simulator and the executor.

Both the simulator (which models the StarPU policies) and the executor (which
gives StarPU the tasks) call these functions, so that StarPU receives exactly
the priorities the simulation assumed, and the simulated dm-family policies
group tasks as StarPU's history-based performance models do.

Priorities
    A task's priority is its bottom level (the longest path from its start to
    the end of the graph, HEFT's upward rank) over per-task weights (the
    simulator's durations on the fastest kind plus the runtime's cost per
    task). StarPU takes ``int`` priorities within the range the policy in use
    declares (``starpu_sched_get_min_priority()`` ..
    ``starpu_sched_get_max_priority()``); :func:`starpu_priorities` maps the
    bottom levels there by dense rank: monotone, equal levels stay equal, and
    distinct levels stay distinct whenever the range has room for them (it
    has where the policy declares the whole ``int`` range: prio, dmdas), else
    neighbouring ranks share a priority, evenly (dmdasd's declared levels,
    below).

Declared ranges
    dmdasd decides where a task goes from the predicted work queued ahead of
    it on each worker. Where the scheduling context declares no priority
    range (the policy's own ``[INT_MIN, INT_MAX]`` is not a declaration),
    StarPU 1.3.10 finds that work by walking every worker's queue and reading
    each queued task's predicted length under the worker's lock
    (``_starpu_fifo_get_exp_len_prev_task_list``, src/sched_policies/fifo_queues.c,
    called from ``compute_all_performance_predictions``,
    src/sched_policies/deque_modeling_policy_data_aware.c). Where the context
    declares one (``STARPU_MIN_PRIO`` and ``STARPU_MAX_PRIO``, read into the
    initial context by ``starpu_conf_init``, src/core/workers.c), it keeps the
    sums per priority level instead (``exp_len_per_priority``, updated by each
    push and pop over the levels up to the task's) and reads one sum per
    worker, without the lock. tilecast declares :data:`DECLARED_LEVELS`
    levels for dmdasd (:func:`declared_range`): its steps of small tasks ran
    1.5-3x faster so (docs/scheduling.md, "dmdasd with a declared priority
    range"), and its priorities are ranked into those levels for the
    simulator and the executor alike.

Footprints
    StarPU's history-based model keys its samples by the task's footprint,
    which, for codelets without a footprint function (tilecast's), is a hash of
    the buffers' interfaces only: for vector handles, their sizes
    (``_starpu_compute_buffers_footprint``, src/core/perfmodel/perfmodel.c;
    ``footprint_vector_interface_crc32``, src/datawizard/interfaces/vector_interface.c).
    :func:`footprint_groups` numbers the (kernel, buffer sizes) groups.
"""

from __future__ import annotations

import os

import numpy as np

from tilecast.errors import FieldError
from tilecast.graph.deps import successors

#: scheduling policies whose simulation orders tasks by priority, and to which the executor passes them
USES_PRIORITIES = ("prio", "dmdas", "dmdasd")

INT_MIN, INT_MAX = -(2**31), 2**31 - 1

#: the priority range each policy declares when the application sets none (StarPU 1.3.10): the
#: policies that use priorities take "any integer" (eager_central_priority_policy.c,
#: initialize_eager_center_priority_policy; deque_modeling_policy_data_aware.c,
#: initialize_dmda_sorted_policy; work_stealing_policy.c, initialize_ws_policy); the others set
#: none, so both bounds stay 0 (src/core/sched_ctx.c, _starpu_create_sched_ctx).
PRIORITY_RANGE = {"prio": (INT_MIN, INT_MAX), "dmdas": (INT_MIN, INT_MAX), "dmdasd": (INT_MIN, INT_MAX),
                  "ws": (INT_MIN, INT_MAX), "lws": (INT_MIN, INT_MAX)}


#: priority levels tilecast declares to StarPU for dmdasd (see "Declared ranges" above): each push and pop
#: updates the sums of the levels up to its task's, so that few levels cost little (steps of 8,714 tasks
#: ran about as fast with 16 to 256 levels, about 2x slower with 8,192, as slow as with none); 0 declares none
DECLARED_LEVELS = 64
#: the most levels that may be declared (StarPU allocates two arrays of that many entries per worker)
MAX_LEVELS = 2**20
#: the policies for which tilecast declares a range: those whose decisions read the sums
DECLARING = ("dmdasd",)
#: environment variable that overrides :data:`DECLARED_LEVELS` (0: declare none, as StarPU runs by default)
LEVELS_ENV = "TILECAST_PRIORITY_LEVELS"


def declared_levels() -> int:
    """Levels declared for the :data:`DECLARING` policies: ``$TILECAST_PRIORITY_LEVELS`` or
    :data:`DECLARED_LEVELS` (0: none)."""
    raw = os.environ.get(LEVELS_ENV, "").strip()
    if not raw:
        return DECLARED_LEVELS
    try:
        n = int(raw)
    except ValueError:
        raise FieldError(f"{LEVELS_ENV}={raw!r}: expected a whole number of priority levels (0: none)") from None
    if n < 0 or n == 1 or n > MAX_LEVELS:
        raise FieldError(f"{LEVELS_ENV}={raw!r}: expected 0 (declare none) or 2 to {MAX_LEVELS} levels")
    return n


def declared_range(sched: str) -> tuple[int, int] | None:
    """The priority range tilecast declares to StarPU for ``sched`` (``STARPU_MIN_PRIO``,
    ``STARPU_MAX_PRIO``), or None where it declares none."""
    n = declared_levels() if sched in DECLARING else 0
    return (0, n - 1) if n else None


def reads_queued_tasks(sched: str) -> bool:
    """Whether ``sched``'s decisions read every queued task's predicted length (dmdasd without a declared
    range) rather than one sum per worker."""
    return sched in DECLARING and declared_range(sched) is None


def priority_range(sched: str) -> tuple[int, int]:
    """(min, max) priority of StarPU policy ``sched`` as it runs under tilecast: the range tilecast declares
    for it, else the one the policy declares itself (``(0, 0)`` for those that set none)."""
    return declared_range(sched) or PRIORITY_RANGE.get(sched, (0, 0))


def bottom_level(duration, pred_ptr: np.ndarray, pred: np.ndarray) -> np.ndarray:
    """Longest path from the start of each task to the end of the graph (HEFT's upward rank).

    Tasks are in submission order, so every predecessor has a smaller id and
    one pass in reverse id order is a topological sweep (plain Python over
    lists, about 0.5 us per task).
    """
    n = len(duration)
    succ_ptr, succ = successors(np.asarray(pred_ptr, dtype=np.int64), pred, n)
    w = np.asarray(duration, dtype=np.float64).tolist()
    ptr, sc = succ_ptr.tolist(), succ.tolist()
    bl = [0.0] * n
    get = bl.__getitem__
    for i in range(n - 1, -1, -1):
        a, b = ptr[i], ptr[i + 1]
        bl[i] = (max(map(get, sc[a:b])) if b > a else 0.0) + w[i]
    return np.asarray(bl)


def starpu_priorities(levels, lo: int, hi: int) -> np.ndarray:
    """``levels`` (higher first) as StarPU int priorities within [lo, hi], by dense rank.

    Monotone (a higher level never gets a lower priority), equal levels get
    equal priorities; distinct levels stay distinct while their number fits
    the range, else neighbouring ranks share a priority (evenly). The ranks
    are centred in the range, so that a range holding 0 keeps the middle rank
    near StarPU's default priority 0.
    """
    levels = np.asarray(levels, dtype=np.float64)
    if lo > hi:
        raise ValueError(f"empty priority range [{lo}, {hi}]")
    if len(levels) == 0:
        return np.zeros(0, dtype=np.int32)
    distinct, rank = np.unique(levels, return_inverse=True)
    m = len(distinct)
    span = hi - lo + 1
    if m <= span:
        out = lo + (span - m) // 2 + rank.astype(np.int64)
    else:
        out = lo + (rank.astype(np.int64) * span) // m
    return out.astype(np.int32)


def task_priorities(weights, pred_ptr, pred, sched: str) -> np.ndarray:
    """The priorities StarPU policy ``sched`` gets: bottom levels over ``weights``, as ints in its range."""
    return starpu_priorities(bottom_level(weights, pred_ptr, pred), *priority_range(sched))


def footprint_groups(graph) -> np.ndarray:
    """Per task, the id of its (kernel, sizes of its buffers in order) group: StarPU's footprint."""
    n = graph.n_tasks
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    counts = np.diff(graph.acc_ptr)
    width = int(counts.max()) if len(counts) else 0
    # Each row (kernel, sizes in order, -1 past the last buffer) as one int64 in mixed radix, each
    # column by its rank: keys sort as the rows do, so np.unique numbers the groups as it would the
    # rows, with a 1-d sort instead of a sort of rows (a gpt2-xl step: 0.3 s instead of 5 s).
    distinct, tile_rank = np.unique(np.asarray(graph.tile_nbytes, dtype=np.int64), return_inverse=True)
    radix = len(distinct) + 1  # rank 0: no buffer (-1 sorts first)
    if width and int(graph.kernel.max()) + 1 <= (2**63 - 1) // radix**width:
        weight = radix ** np.arange(width - 1, -1, -1, dtype=np.int64)
        slot = np.arange(len(graph.acc_tile)) - np.repeat(graph.acc_ptr[:-1], counts)
        per_access = (tile_rank.reshape(-1).astype(np.int64)[graph.acc_tile] + 1) * weight[slot]
        key = np.asarray(graph.kernel, dtype=np.int64) * radix**width
        has = counts > 0
        key[has] += np.add.reduceat(per_access, graph.acc_ptr[:-1][has])
        _, inverse = np.unique(key, return_inverse=True)
        return inverse.reshape(-1).astype(np.int64)
    return footprint_groups_by_rows(graph)


def footprint_groups_by_rows(graph) -> np.ndarray:
    """:func:`footprint_groups` by sorting the rows themselves (slower; where keys would overflow)."""
    n = graph.n_tasks
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    counts = np.diff(graph.acc_ptr)
    width = int(counts.max()) if len(counts) else 0
    rows = np.full((n, 1 + width), -1, dtype=np.int64)
    rows[:, 0] = graph.kernel
    if width:
        task = np.repeat(np.arange(n), counts)
        slot = np.arange(len(graph.acc_tile)) - np.repeat(graph.acc_ptr[:-1], counts)
        rows[task, 1 + slot] = np.asarray(graph.tile_nbytes, dtype=np.int64)[graph.acc_tile]
    _, inverse = np.unique(rows, axis=0, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64)


def footprint_means(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Each row of ``values`` (kinds x tasks) replaced by its mean over each task's footprint group,
    the estimate StarPU's history-based model converges to (the mean of its samples per footprint)."""
    values = np.atleast_2d(np.asarray(values, dtype=np.float64))
    n_groups = int(groups.max()) + 1 if len(groups) else 0
    out = np.empty_like(values)
    for k, row in enumerate(values):
        finite = np.isfinite(row)
        total = np.bincount(groups[finite], weights=row[finite], minlength=n_groups)
        seen = np.bincount(groups[finite], minlength=n_groups)
        mean = np.where(seen > 0, total / np.maximum(seen, 1), np.inf)
        out[k] = np.where(finite, mean[groups], row)
    return out
