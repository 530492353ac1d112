"""The searches through queues, measured on StarPU with queues of known length: prio's cost per level of
its priority tree, and dmdas's cost per task its sorted insertion walks past (:func:`measure_sorted`).

``n`` independent tiny tasks (fills of tiles of their own) are submitted
while the workers are paused, so every task is queued before the first pop,
and the pop that leaves ``k - 1`` tasks finds ``k`` queued. Under prio with
distinct priorities the tree then has ``k`` stages and the pop searches
:func:`tilecast.simulator.queue_costs.tree_levels` (k) levels; with equal
priorities (one stage) the same graph under the same policy searches one
level each time. The distinct priorities decrease in submission order, so
both runs pop the tasks in the same order (a shuffled order would also
change how the tasks' structures are reached in memory: ``shuffled``
measures that apart). Everything else (the kernels, the runtime's cost per
task, the central queue's lock) is the same in both runs, so the difference of
their makespans over the difference of levels searched is the cost of a
level, measured once per machine at the sizes the suite's steps queue
(thousands of ready tasks). The pushes happen during the paused submission,
outside the makespan: a push's search costs as much as a pop's (both are a
red-black tree lookup; ``prio_list_add``, ``prio_list_erase``,
src/common/prio_list.h).
"""

from __future__ import annotations

import numpy as np

from tilecast.simulator.queue_costs import tree_levels

SIZES = (1024, 4096, 16384)
ELEMS = 16  # floats per tile: a task of about a microsecond


def fills(n: int, elems: int = ELEMS):
    """``n`` fill tasks on tiles of their own: no dependencies, every one ready at submission."""
    from tilecast.graph import GraphBuilder, Tiling

    b = GraphBuilder(Tiling.uniform(elems))
    for i in range(n):
        x = b.tensor(f"x{i}", (elems,), (None,), "activation")
        b.add("fill", [x.tile_ids(0)], dict(n=elems, value=float(i)))
    return b.build()


def extra_levels(n: int) -> int:
    """Tree levels the ``n`` pops of a queue of ``n`` distinct priorities search beyond one each."""
    return sum(tree_levels(k) for k in range(1, n + 1)) - n


def _alternate(session, g, store, distinct, repeats: int, figure: str, progress=None) -> dict:
    """``g`` submitted with the workers paused, with the ``distinct`` priorities and with equal ones,
    alternately ``repeats`` times each after a warm-up: the median of the session's ``figure`` for each
    (``distinct_s``, ``equal_s``)."""
    equal = np.ones(len(distinct))
    got = {"distinct": [], "equal": []}
    session.execute(g, store, submit_paused=True, trace=False, priority=equal)  # warm-up
    for _ in range(repeats):
        for name, w in (("distinct", distinct), ("equal", equal)):
            session.execute(g, store, submit_paused=True, trace=False, priority=w)
            got[name].append(getattr(session, figure))
            if progress:
                progress()
    return {"distinct_s": float(np.median(got["distinct"])), "equal_s": float(np.median(got["equal"]))}


def measure(workers: int = 1, sizes=SIZES, repeats: int = 5, progress=None, shuffled: bool = False) -> list[dict]:
    """Per size: the median makespans (s) of the fills under prio with distinct and with equal priorities,
    run alternately ``repeats`` times each in one StarPU session, and the extra levels searched. ``shuffled``:
    the distinct priorities in a random order of the tasks (popped in that order), instead of decreasing in
    submission order."""
    from tilecast.executor.starpu_session import StarPUSession
    from tilecast.reference.tiles import TileStore

    rows = []
    with StarPUSession("prio", workers) as session:
        for n in sizes:
            g = fills(n)
            store = TileStore(g)
            order = np.random.default_rng(n).permutation(n) if shuffled else np.arange(n)[::-1]
            distinct = order.astype(np.float64) + 1.0  # weights: a higher one is popped first
            got = _alternate(session, g, store, distinct, repeats, "last_makespan_s", progress)
            rows.append({"tasks": n, "workers": workers, **got, "extra_levels": extra_levels(n)})
    return rows


def level_cost(rows) -> float:
    """Seconds per tree level: the least-squares slope through 0 of the makespan differences over the extra
    levels (0 when the differences are not positive)."""
    x = np.array([r["extra_levels"] for r in rows], dtype=np.float64)
    y = np.array([r["distinct_s"] - r["equal_s"] for r in rows], dtype=np.float64)
    if not len(x) or x @ x <= 0:
        return 0.0
    return max(float(x @ y / (x @ x)), 0.0)


SORTED_SIZES = (1024, 2048, 4096)


def walk_steps(n: int) -> int:
    """Tasks walked past by ``n`` insertions of decreasing priorities into one sorted queue: each walks past
    every task queued before it (fifo_queues.c, ``_starpu_fifo_push_sorted_task``)."""
    return n * (n - 1) // 2


def measure_sorted(workers: int = 1, sizes=SORTED_SIZES, repeats: int = 5, progress=None) -> list[dict]:
    """dmdas's sorted insertion on a queue of known length: per size, the submitting thread's median time for
    ``n`` independent fills submitted while the workers are paused under dmdas, with priorities decreasing in
    submission order (every insertion walks past every task queued before it: :func:`walk_steps`) and with
    equal priorities (appended at once, no walk), run alternately ``repeats`` times each in one session.

    StarPU 1.3.10: ``push_task_on_best_worker`` (src/sched_policies/deque_modeling_policy_data_aware.c) calls
    ``_starpu_fifo_push_sorted_task`` (src/sched_policies/fifo_queues.c) in the thread that pushes; with
    the workers paused that is the submitting thread, whose time the session reports
    (``last_submit_s``). Everything else a push does (the decision, the locks) is the same in both runs."""
    from tilecast.executor.starpu_session import StarPUSession
    from tilecast.reference.tiles import TileStore

    rows = []
    with StarPUSession("dmdas", workers) as session:
        for n in sizes:
            g = fills(n)
            store = TileStore(g)
            distinct = np.arange(n, 0, -1, dtype=np.float64)
            got = _alternate(session, g, store, distinct, repeats, "last_submit_s", progress)
            rows.append({"tasks": n, "workers": workers, **got, "steps": walk_steps(n)})
    return rows


def step_cost(rows) -> float:
    """Seconds per task walked past: the least-squares slope through 0 of the submission time differences
    over the tasks walked past (0 when not positive)."""
    x = np.array([r["steps"] for r in rows], dtype=np.float64)
    y = np.array([r["distinct_s"] - r["equal_s"] for r in rows], dtype=np.float64)
    if not len(x) or x @ x <= 0:
        return 0.0
    return max(float(x @ y / (x @ x)), 0.0)
