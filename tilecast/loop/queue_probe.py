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
level, measured at calibration for each worker count at the sizes the
suite's steps queue (thousands of ready tasks) and charged as measured
(:func:`tilecast.loop.host_cost.set_measured_tree`). The pushes happen during the paused submission,
outside the makespan: a push's search costs as much as a pop's (both are a
red-black tree lookup; ``prio_list_add``, ``prio_list_erase``,
src/common/prio_list.h).
"""

from __future__ import annotations

import bisect

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


#: queue lengths of the sorted-insertion probe: from walks the first-level cache holds to walks of thousands of
#: tasks, as a step of tens of thousands of small tasks queues on one worker
SORTED_SIZES = (256, 512, 1024, 2048, 4096, 8192)


def insertion_walks(priorities) -> np.ndarray:
    """Per insertion into one sorted queue, in order, the queued tasks it walks past: every one of at least its
    priority (fifo_queues.c, ``_starpu_fifo_push_sorted_task``, walks from the head of a list sorted from the
    highest priority down), but none when every queued task has its priority (the function's shortcut)."""
    p = np.asarray(list(priorities), dtype=np.float64)
    queued = []
    out = np.empty(len(p), dtype=np.int64)
    for i, x in enumerate(p.tolist()):
        j = bisect.bisect_left(queued, x)  # queued ascending: those from j on are at least x
        out[i] = 0 if queued and queued[0] == x == queued[-1] else len(queued) - j
        queued.insert(j, x)
    return out


def measure_sorted(sizes=SORTED_SIZES, repeats: int = 5, progress=None) -> list[dict]:
    """dmdas's sorted insertion on queues of known length: per size ``n``, the submitting thread's median time
    for ``n`` independent fills submitted while the one worker is paused under dmdas, with distinct priorities
    in a random order of the tasks (each insertion walks past the queued tasks of higher priority:
    :func:`insertion_walks`) and with equal priorities (appended at once, no walk), run alternately
    ``repeats`` times each in one session. Rows: ``tasks``, ``distinct_s``, ``equal_s``, ``walks`` (per
    insertion).

    The random order is a step's: its ready queue is sorted by priority, not by where the tasks lie in
    memory, so each step of a walk waits for a cache line the prefetchers did not fetch. With priorities
    decreasing in the tasks' order of creation (the list in memory order) the same walks cost 2.0-2.7 ns a
    step at every length on the 2-core Intel Xeon guest, with the order random 2.7 ns up to about 200 steps
    and 7.6 beyond (:func:`walk_curve`), and a step of a 68,498-task graph on one worker (gpt2 2 x 384 at
    tile 32) ran 325 ms longer under dmdas than under dmda for 59 million steps simulated: 5.5 ns a step.
    One worker: the cost is the walking core's; every worker count's forecast takes it.

    StarPU 1.3.10: ``push_task_on_best_worker`` (src/sched_policies/deque_modeling_policy_data_aware.c) calls
    ``_starpu_fifo_push_sorted_task`` (src/sched_policies/fifo_queues.c) in the thread that pushes; with
    the workers paused that is the submitting thread, whose time the session reports
    (``last_submit_s``). Everything else a push does (the decision, the locks) is the same in both runs."""
    from tilecast.executor.starpu_session import StarPUSession
    from tilecast.reference.tiles import TileStore

    rows = []
    with StarPUSession("dmdas", 1) as session:
        for n in sizes:
            g = fills(n)
            store = TileStore(g)
            distinct = np.random.default_rng(n).permutation(n).astype(np.float64) + 1.0
            got = _alternate(session, g, store, distinct, repeats, "last_submit_s", progress)
            rows.append({"tasks": n, "workers": 1, **got, "walks": insertion_walks(distinct)})
    return rows


def walk_curve(rows) -> tuple[float, float, float]:
    """(seconds a step over an insertion's first ``knee`` steps, seconds a step beyond, ``knee``) fitted to the
    rows of :func:`measure_sorted` (least squares on the relative error of each size's time difference,
    :func:`tilecast.simulator.queue_costs.list_walk_s` summed over its insertions). Fewer than three usable
    sizes: one cost per step, the slope through 0, for every step (knee 0, no far cost)."""
    from scipy.optimize import least_squares

    use = [(np.asarray(r["walks"], dtype=np.float64), r["distinct_s"] - r["equal_s"]) for r in rows
           if r["distinct_s"] - r["equal_s"] > 0 and np.sum(r["walks"]) > 0]
    if len(use) < 3:
        x = np.array([k.sum() for k, _ in use])
        y = np.array([d for _, d in use])
        return (max(float(x @ y / (x @ x)), 0.0) if len(x) else 0.0), 0.0, 0.0
    longest = max(float(k.max()) for k, _ in use)

    def residuals(v):
        near, far, knee = v[0] * 1e-9, v[1] * 1e-9, v[2]
        model = [np.minimum(k, knee).sum() * near + np.maximum(k - knee, 0.0).sum() * far for k, _ in use]
        return [(m - d) / d for m, (_, d) in zip(model, use)]

    fit = least_squares(residuals, x0=[2.5, 7.0, min(200.0, longest / 2)],
                        bounds=([0.0, 0.0, 1.0], [1e3, 1e3, longest]))
    near, far, knee = fit.x[0] * 1e-9, fit.x[1] * 1e-9, float(fit.x[2])
    return float(near), float(far), knee
