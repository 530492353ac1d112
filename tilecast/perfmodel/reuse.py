"""Where a task's inputs are in a step: the reuse distance of its tile accesses, against the core's cache.

Calibration times each kernel shape twice as StarPU task chains
(:mod:`tilecast.executor.runtime_timer`): *hot*, each chain's repeats back to
back, so a task finds its buffers in the core's cache; and *cold*, the
chains of many shapes interleaved, so each repeat runs after one task of
every other shape and finds its buffers evicted. Inside a step a task lies
in between: some of its tiles were touched just before, others long ago.

The fraction of a task's bytes that come from beyond the cache is read from
the graph alone. The *reuse distance* of an access is the bytes of all tile
accesses (in the graph's task order) since the previous access to the same
tile, counted from that previous access; infinite where the tile was never
touched before. An access is *cold* when its distance exceeds the cache
size ``C`` (the per-core L2, :mod:`tilecast.perfmodel.cache_size`). A task's
duration is then ``hot + f * (cold - hot)``, ``f`` the cold share of its
bytes: a model without fitted parameters. Measured on a 2-core Xeon
(2 MiB L2 per core) against the per-task durations of traced steps, it
gives step sums within -8%..+11% where the hot times alone are 17-38% fast
and the cold ones 12-29% slow (docs/predicting.md).

Beyond the core's cache lies a shared last-level cache. Calibration also
times each shape *near*: interleaved within a few MiB a core, its buffers
evicted from the core's cache but not from the shared one. A cold byte
whose reuse distance is within that cache's share per core ``S``
(:func:`tilecast.perfmodel.cache_size.llc_per_core`; a first access counts
from the step before, :func:`step_bytes`) takes the near figure, one beyond
it the cold one: ``hot + (f - b) * (near - hot) + b * (cold - hot)``, ``b``
the share beyond ``S`` (:func:`far_fraction`).

Everything is vectorised over the graph's access arrays (one stable sort by
tile), as graphs hold millions of tasks. This graph-order share is what a
report on the graph alone uses; a simulation computes the share when each
task starts, from the cache state of the worker running it
(:mod:`tilecast.simulator.worker_cache`), which with one worker running the
tasks in submission order is this one.
"""

from __future__ import annotations

import weakref

import numpy as np


def access_tasks(graph) -> np.ndarray:
    """The task of each access (``graph.acc_tile``'s entries, in order)."""
    return np.repeat(np.arange(graph.n_tasks, dtype=np.int64), np.diff(graph.acc_ptr))


def reuse_distances(graph) -> np.ndarray:
    """Per access, the bytes accessed (all tiles, in task order) from the previous access to the same tile
    (included) up to this one (excluded); ``inf`` for a tile's first access."""
    tiles = np.asarray(graph.acc_tile)
    nbytes = np.asarray(graph.tile_nbytes, dtype=np.float64)[tiles]
    before = np.cumsum(nbytes) - nbytes  # bytes accessed before each access
    order = np.argsort(tiles, kind="stable")  # each tile's accesses together, in task order
    same = tiles[order[1:]] == tiles[order[:-1]]
    out = np.full(len(tiles), np.inf)
    now, prev = order[1:][same], order[:-1][same]
    out[now] = before[now] - before[prev]
    return out


# id(graph) -> (weak reference to it, its access arrays, {cache bytes: cold share per task}): tune and accuracy
# predict one graph on several policies and worker counts; kept while the graph lives with the same arrays
_FRACTIONS: dict = {}


def cold_fraction(graph, cache_bytes: float) -> np.ndarray:
    """Per task, the share (0..1) of the bytes it accesses whose reuse distance exceeds ``cache_bytes``
    (0 for a task without buffers). Read-only; computed once per graph and cache size."""
    if not cache_bytes > 0:
        raise ValueError(f"cache_bytes: must be a positive number of bytes, got {cache_bytes!r}")
    return _held(graph, cache_bytes, _cold_fraction)


def far_fraction(graph, cache_bytes: float, llc_bytes: float) -> np.ndarray:
    """Per task, the share (0..1) of the bytes it accesses that come from beyond a shared last-level cache
    share of ``llc_bytes``: cold for the core's ``cache_bytes`` (:func:`cold_fraction`) and with a reuse
    distance beyond ``llc_bytes`` too, a tile's first access in the step counting as touched one step before
    (its distance the bytes a step accesses; the step before ran the same graph). Read-only; computed once
    per graph and sizes."""
    if not cache_bytes > 0:
        raise ValueError(f"cache_bytes: must be a positive number of bytes, got {cache_bytes!r}")
    if not llc_bytes > 0:
        raise ValueError(f"llc_bytes: must be a positive number of bytes, got {llc_bytes!r}")
    return _held(graph, ("far", cache_bytes, llc_bytes), _far_fraction)


def _held(graph, key, compute) -> np.ndarray:
    """``compute(graph, *sizes)`` for ``key`` (a size, ("far", sizes...) or ("bytes",)), kept while the graph
    lives."""
    sizes = key[1:] if isinstance(key, tuple) else (key,)
    arrays = (graph.acc_ptr, graph.acc_tile, graph.tile_nbytes)
    held = _FRACTIONS.get(id(graph))
    if held is None or held[0]() is not graph or any(a is not b for a, b in zip(held[1], arrays)):
        try:
            ref = weakref.ref(graph)
        except TypeError:  # cannot be weakly referenced: not kept
            return compute(graph, *sizes)
        for k in [k for k, v in _FRACTIONS.items() if v[0]() is None]:
            del _FRACTIONS[k]
        held = _FRACTIONS[id(graph)] = (ref, arrays, {})
    if key not in held[2]:
        f = compute(graph, *sizes)
        f.flags.writeable = False
        held[2][key] = f
    return held[2][key]


def task_bytes(graph) -> np.ndarray:
    """Per task, the bytes of the tiles it accesses (each access counted). Read-only; computed once per graph."""
    return _held(graph, ("bytes",), _task_bytes)


def _task_bytes(graph) -> np.ndarray:
    nbytes = np.asarray(graph.tile_nbytes, dtype=np.float64)[np.asarray(graph.acc_tile)]
    return np.bincount(access_tasks(graph), weights=nbytes, minlength=graph.n_tasks)


def _cold_fraction(graph, cache_bytes: float) -> np.ndarray:
    n = graph.n_tasks
    nbytes = np.asarray(graph.tile_nbytes, dtype=np.float64)[np.asarray(graph.acc_tile)]
    task = access_tasks(graph)
    far = reuse_distances(graph) > cache_bytes
    total = task_bytes(graph)
    cold = np.bincount(task, weights=np.where(far, nbytes, 0.0), minlength=n)
    return np.divide(cold, total, out=np.zeros(n), where=total > 0)


def _far_fraction(graph, cache_bytes: float, llc_bytes: float) -> np.ndarray:
    n = graph.n_tasks
    nbytes = np.asarray(graph.tile_nbytes, dtype=np.float64)[np.asarray(graph.acc_tile)]
    task = access_tasks(graph)
    d = reuse_distances(graph)
    beyond = (d > cache_bytes) & (np.where(np.isinf(d), step_bytes(graph), d) > llc_bytes)
    total = task_bytes(graph)
    far = np.bincount(task, weights=np.where(beyond, nbytes, 0.0), minlength=n)
    return np.divide(far, total, out=np.zeros(n), where=total > 0)


def step_bytes(graph) -> int:
    """The bytes of all the step's tile accesses: the reuse distance of a tile's first access, counted from
    the step before."""
    return int(np.asarray(graph.tile_nbytes, dtype=np.int64)[np.asarray(graph.acc_tile)].sum())


def interpolate(hot: np.ndarray, cold: np.ndarray, fraction: np.ndarray) -> np.ndarray:
    """``hot + fraction * (cold - hot)``: a task's duration between its hot and cold lane times."""
    hot = np.asarray(hot, dtype=np.float64)
    return hot + np.asarray(fraction, dtype=np.float64) * (np.asarray(cold, dtype=np.float64) - hot)
