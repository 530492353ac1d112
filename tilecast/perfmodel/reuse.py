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
    arrays = (graph.acc_ptr, graph.acc_tile, graph.tile_nbytes)
    held = _FRACTIONS.get(id(graph))
    if held is None or held[0]() is not graph or any(a is not b for a, b in zip(held[1], arrays)):
        try:
            ref = weakref.ref(graph)
        except TypeError:  # cannot be weakly referenced: not kept
            return _cold_fraction(graph, cache_bytes)
        for k in [k for k, v in _FRACTIONS.items() if v[0]() is None]:
            del _FRACTIONS[k]
        held = _FRACTIONS[id(graph)] = (ref, arrays, {})
    if cache_bytes not in held[2]:
        f = _cold_fraction(graph, cache_bytes)
        f.flags.writeable = False
        held[2][cache_bytes] = f
    return held[2][cache_bytes]


def _cold_fraction(graph, cache_bytes: float) -> np.ndarray:
    n = graph.n_tasks
    nbytes = np.asarray(graph.tile_nbytes, dtype=np.float64)[np.asarray(graph.acc_tile)]
    task = access_tasks(graph)
    far = reuse_distances(graph) > cache_bytes
    total = np.bincount(task, weights=nbytes, minlength=n)
    cold = np.bincount(task, weights=np.where(far, nbytes, 0.0), minlength=n)
    return np.divide(cold, total, out=np.zeros(n), where=total > 0)


def interpolate(hot: np.ndarray, cold: np.ndarray, fraction: np.ndarray) -> np.ndarray:
    """``hot + fraction * (cold - hot)``: a task's duration between its hot and cold lane times."""
    hot = np.asarray(hot, dtype=np.float64)
    return hot + np.asarray(fraction, dtype=np.float64) * (np.asarray(cold, dtype=np.float64) - hot)
