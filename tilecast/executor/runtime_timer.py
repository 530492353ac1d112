"""Time kernel shapes as StarPU tasks, the way a training step runs them.

A kernel runs slower inside the runtime than timed alone in a loop (measured
here on gpt2-tiny at tile 64: attention kernels 1.5-1.9x, GEMM 1.17x), so
calibrating on isolated timings makes first predictions too fast. This
timer runs each shape through the real glue and codelets instead: one *lane*
per worker, each lane its own buffers and a chain of ``repeats`` tasks of the
shape (its outputs written in turn, so the lanes run side by side, every
worker busy with the same shape). Each task's duration comes from StarPU's
profiling info, as in a measured step; the first task of each lane is left
out (it warms caches and StarPU's data structures).

Shapes are grouped into graphs of bounded buffer memory and run in one
session. How they run depends on the session's policy, and gives the two
figures a shape is calibrated with:

- *cold*, under ``eager``: every chain's first task is ready at once, so
  each repeat runs after one task of every other shape of the graph and
  finds its buffers evicted from the core's cache;
- *hot*, under a policy that orders by priority (``prio``, which takes any
  int in StarPU 1.3.10: ``initialize_eager_center_priority_policy``):
  weights whose bottom levels rank the shapes (:func:`chain_order_weights`)
  run the chains one shape after another, each chain's repeats back to
  back, so that its buffers stay in the core's cache.

Under a priority policy each graph opens with a chain of untimed tasks of its
first shape's kernel (:func:`warmup_case`): in the first millisecond or so of a graph
the first chains ran 2-4x their later time on the 2-core Xeon guest (a 32 x 32
x 32 GEMM 1.8-3.6 us against 0.7-0.9, on one worker and on two, in most graphs
where it came first, and so in every hot pass of a calibration), and a chain
of the same kernel before them took that away, where a chain of ``fill`` did
not on two workers (docs/predicting.md, "The first shape of a hot graph").

How far the cold figure's buffers were evicted depends on the bytes the
graph interleaves: in graphs of up to :data:`MAX_GROUP_BYTES` they come back
from main memory, in graphs of :data:`NEAR_LANE_BYTES` a lane (the *near*
figure, also under ``eager``) from the shared last-level cache. A task inside a step
lies between hot and those two, by how far back its tiles were last touched
(:mod:`tilecast.perfmodel.reuse`). Shapes with an empty buffer
(StarPU registers no handle for them) are left to the isolated timer.
"""

from __future__ import annotations

import numpy as np

from tilecast.graph import Tiling
from tilecast.graph.builder import GraphBuilder
from tilecast.graph.priorities import USES_PRIORITIES
from tilecast.kernels import get

MAX_GROUP_BYTES = 512 << 20  # buffer memory of one calibration graph (all lanes of its shapes)
# ... of one graph of the near figure, per lane (a lane per worker): its chains interleaved within 16 MiB a core,
# beyond the core's level-2 cache (1-2 MiB on the server cores of recent years), within a shared last-level
# cache's share (tens to hundreds of MiB)
NEAR_LANE_BYTES = 16 << 20
MAX_GROUP_TASKS = 20_000
# The untimed chain that opens a graph under a priority policy (warmup_case): at most WARMUP_TASKS tasks per
# lane, fewer for larger shapes, so that it moves about WARMUP_BYTES per lane (200 tasks of a 32 x 32 x 32
# GEMM's 12 KiB, about a millisecond; 2 of a shape of 2 MiB or more)
WARMUP_TASKS = 200
WARMUP_BYTES = 4 << 20


def runnable(name: str, shape) -> bool:
    """Can this shape run as a StarPU task (every buffer non-empty)?"""
    k = get(name)
    return bool(np.all(np.asarray(shape, dtype=np.float64)[len(k.params):] > 0))


def _groups(cases, repeats, lanes, group_bytes: int = MAX_GROUP_BYTES):
    """Consecutive runs of cases whose lanes' buffers (``group_bytes``) and tasks stay under the group
    limits."""
    group, nbytes, ntasks = [], 0, 0
    for i, (name, shape) in enumerate(cases):
        k = get(name)
        b = float(np.sum(np.asarray(shape, dtype=np.float64)[len(k.params):])) * lanes
        t = int(repeats[i]) * lanes
        if group and (nbytes + b > group_bytes or ntasks + t > MAX_GROUP_TASKS):
            yield group
            group, nbytes, ntasks = [], 0, 0
        group.append(i)
        nbytes += b
        ntasks += t
    if group:
        yield group


def lanes_graph(cases, idx, repeats, lanes: int):
    """The calibration graph of cases ``idx``: per case and lane, buffers and a chain of tasks.

    Returns (graph, buffer contents per tile, case index per task, lane-first flag per task).
    """
    from tilecast.perfmodel.timers import make_buffers

    b = GraphBuilder(Tiling(), meta={"calibration": True})
    contents, task_case, task_first = [], [], []
    for i in idx:
        name, shape = cases[i]
        k = get(name)
        shape = np.asarray(shape, dtype=np.float64)
        params, nbytes = shape[:len(k.params)], shape[len(k.params):]
        tiles = []
        for lane in range(lanes):
            bufs = make_buffers(k.id, nbytes, seed=lane)
            lane_tiles = []
            for j, buf in enumerate(bufs):
                t = b.tensor(f"c{i}l{lane}b{j}", (buf.size,), (None,), "input", dtype=buf.dtype)
                lane_tiles.append(t.first_tile)
                contents.append(buf)
            tiles.append(lane_tiles)
        tiles = np.asarray(tiles, dtype=np.int64)  # (lanes, buffers)
        reps = int(repeats[i])
        # repeat r of every lane, then r + 1: lanes advance together, each a chain through its written buffers
        order_tiles = np.tile(tiles, (reps, 1))
        b.add(name, [order_tiles[:, j] for j in range(len(k.buffers))], {p: params[j] for j, p in enumerate(k.params)})
        task_case += [i] * (reps * lanes)
        task_first += [r == 0 for r in range(reps) for _ in range(lanes)]
    return b.build(), contents, np.asarray(task_case), np.asarray(task_first)


def warmup_case(cases, idx, repeats) -> tuple[int, int]:
    """The case of ``idx`` whose copy opens a graph under a priority policy, and its chain's tasks per lane.

    The case: of the first case's kernel (a chain of another kernel did not take the slow start away), the
    one of fewest bytes (its tasks the shortest). Its tasks: :data:`WARMUP_BYTES` over its bytes, within 2
    and :data:`WARMUP_TASKS`, and at least its own repeats."""
    def nbytes(i):
        name, shape = cases[i]
        return float(np.sum(np.asarray(shape, dtype=np.float64)[len(get(name).params):]))

    kernel = cases[idx[0]][0]
    i = min((j for j in idx if cases[j][0] == kernel), key=nbytes)
    tasks = int(np.clip(WARMUP_BYTES // max(nbytes(i), 1.0), 2, WARMUP_TASKS))
    return i, max(tasks, int(repeats[i]))


def chain_order_weights(task_case: np.ndarray, order: list, lanes: int) -> np.ndarray:
    """Per-task weights whose bottom levels rank the cases of ``order`` first to last: every chain's last
    task (the last ``lanes`` tasks of a case) weighs more than any later case's whole chain, so that a
    priority policy runs the chains case by case (a chain's repeats back to back)."""
    w = np.ones(len(task_case))
    longest = float(np.bincount(task_case).max()) if len(task_case) else 1.0
    for pos, c in enumerate(order):
        idx = np.flatnonzero(task_case == c)
        w[idx[-lanes:]] = (len(order) - pos) * (longest + 1.0)
    return w


def time_in_runtime(cases, repeats, session, progress=None, group_bytes: int = MAX_GROUP_BYTES,
                    warmup: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(median seconds, median absolute deviation) of each case run as StarPU tasks in ``session``.

    ``repeats[i]`` tasks per lane for case ``i`` (at least 2: the first is a
    warm-up); one lane per worker of the session. Under ``eager`` the cases'
    chains interleave (cold); under a policy that uses priorities they run
    case by case (hot); ``group_bytes`` bounds each graph's buffers (under
    ``eager``: how far the interleaved chains evict each other's buffers). ``progress(n)`` is called
    with the number of cases done after each graph. Cases that cannot run
    (see :func:`runnable`) get NaN. ``warmup=False`` leaves out the untimed chain that opens each graph
    under a priority policy (:func:`warmup_case`; for ``benchmarks/hot_lane_start.py``).
    """
    from tilecast.reference.tiles import TileStore

    n = len(cases)
    med, mad = np.full(n, np.nan), np.full(n, np.nan)
    lanes = session.n_cpus
    repeats = np.maximum(np.asarray(repeats, dtype=np.int64), 2)
    ok = [i for i, (name, shape) in enumerate(cases) if runnable(name, shape)]
    ordered = session.sched in USES_PRIORITIES
    warmup = warmup and ordered
    for group in _groups([cases[i] for i in ok], repeats[ok], lanes, group_bytes):
        idx = [ok[g] for g in group]
        run_cases, run_reps, order = cases, repeats, idx
        if warmup:  # an untimed chain first (its case index n is past every timed one)
            w, w_tasks = warmup_case(cases, idx, repeats)
            run_cases, run_reps, order = list(cases) + [cases[w]], np.append(repeats, w_tasks), [n] + idx
        graph, contents, task_case, task_first = lanes_graph(run_cases, order, run_reps, lanes)
        store = TileStore(graph)
        store.buffers = contents
        weights = chain_order_weights(task_case, order, lanes) if ordered else None
        trace = session.execute(graph, store, trace=True, priority=weights)
        session.tile_handles.release()  # the next group registers its own buffers
        d = (trace["end_s"] - trace["start_s"]).to_numpy()
        keep = ~task_first
        for i in idx:
            t = d[keep & (task_case == i)]
            m = float(np.median(t))
            med[i], mad[i] = m, float(np.median(np.abs(t - m)))
        if progress is not None:
            progress(len(idx))
    return med, mad
