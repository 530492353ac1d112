"""Which of a task's tiles are in its worker's cache when it starts: the cold share per worker, at run time.

Calibration times every shape hot and cold (:mod:`tilecast.perfmodel.reuse`),
and a task's duration is ``hot + f * (cold - hot)``, ``f`` the share of its
bytes that come from beyond the core's cache. Read from the graph alone,
``f`` counts reuse in submission order over all tasks, as if one core ran
them all in that order. In a simulation the worker of each task is known
when it starts, so ``f`` is computed then, from that worker's own history:
a tile is hot for worker ``w`` when ``w`` is the last worker that touched it
(read or wrote it) and the bytes ``w`` accessed since (its own accesses, in
the order its tasks started) do not exceed the cache of ``w``'s kind (the
per-core L2, :mod:`tilecast.perfmodel.cache_size`). A tile last touched on
another core is cold, whether or not this core read it earlier: on the
2-core Xeon's traced steps that rule and a coherent one (a read elsewhere
keeps this core's copy, a write elsewhere drops it) came within 1.1-1.8
points of each other on step sums, this one came closer to run 7's measured
two-worker steps (docs/predicting.md), and it needs one worker and one
counter per tile.

With a shared last-level cache (the lanes' ``llc_bytes``, from a calibration
that also timed the near lane), a byte that is not hot is *near* when the
bytes all workers accessed since its tile was last touched (by any worker;
a tile's first access in the step counts from the step before, the bytes a
step accesses) do not exceed that cache's share per core, and *far*
otherwise: the duration is ``hot + a * (near - hot) + b * (cold - hot)``,
``a`` and ``b`` the near and far shares of its bytes. A tile last written on
the other core comes from the shared cache, not from main memory.

Bookkeeping is O(accesses): a running byte counter per worker and one for
all, and per tile the last worker, that worker's counter and the shared
counter before the access. With one worker
running the tasks in submission order it gives exactly the graph-order
``f`` of :func:`tilecast.perfmodel.reuse.cold_fraction`.

The C loop (``c/tcsim.c``, ``wc_duration``) does the same integer and
double operations in the same order; tests hold the two equal bit for bit.
"""

from __future__ import annotations

import numpy as np


class WorkerCache:
    """Per-worker cache state over a run; :meth:`duration` is called once per task, when it starts.

    ``lanes``: a :class:`tilecast.perfmodel.task_lanes.TaskLanes` (hot and ``cold - hot`` per kind and
    task, the cache per kind); ``worker_kind``: each worker's row in it.
    """

    def __init__(self, lanes, graph, worker_kind):
        from tilecast.perfmodel.reuse import step_bytes

        self.hot = [row.tolist() for row in np.atleast_2d(lanes.hot)]
        self.delta = [row.tolist() for row in np.atleast_2d(lanes.delta)]
        self.kind = [int(k) for k in worker_kind]
        self.cache = [float(lanes.cache_bytes[k]) for k in self.kind]
        self.acc_ptr = np.asarray(graph.acc_ptr, dtype=np.int64).tolist()
        self.acc_tile = np.asarray(graph.acc_tile, dtype=np.int64).tolist()
        self.nbytes = np.asarray(graph.tile_nbytes, dtype=np.int64).tolist()
        self.count = [0] * len(self.kind)  # bytes each worker has accessed so far
        self.last_worker = [-1] * len(self.nbytes)
        self.last_count = [0] * len(self.nbytes)
        # the shared cache: its share per core for each worker (0: none), near - hot per kind and task
        self.llc = [float(lanes.llc_bytes[k]) if lanes.far is not None else 0.0 for k in self.kind]
        self.near_delta = ([row.tolist() for row in np.atleast_2d(lanes.near_delta)] if lanes.far is not None
                           else self.delta)
        self.total = 0  # bytes all workers have accessed so far
        self.last_total = [0] * len(self.nbytes)
        self.step = step_bytes(graph)

    def _touch(self, t: int, w: int) -> tuple[int, int, int]:
        """Task ``t`` starts on worker ``w``: (bytes not hot, of them far, all bytes); records its accesses."""
        last_worker, last_count, last_total, nbytes, tiles = (self.last_worker, self.last_count, self.last_total,
                                                              self.nbytes, self.acc_tile)
        c, g = self.count[w], self.total
        cap, llc, step = self.cache[w], self.llc[w], self.step
        cold = far = total = 0
        for j in range(self.acc_ptr[t], self.acc_ptr[t + 1]):
            x = tiles[j]
            b = nbytes[x]
            if last_worker[x] != w or c - last_count[x] > cap:
                cold += b
                if (g - last_total[x] if last_worker[x] >= 0 else step) > llc:
                    far += b
            total += b
            last_worker[x] = w
            last_count[x] = c
            last_total[x] = g
            c += b
            g += b
        self.count[w] = c
        self.total = g
        return cold, far, total

    def cold_share(self, t: int, w: int) -> float:
        """Task ``t`` starts on worker ``w``: the cold share of its bytes (not hot); records its accesses."""
        cold, _, total = self._touch(t, w)
        return cold / total if total else 0.0

    def duration(self, t: int, w: int) -> float:
        """Seconds task ``t`` takes on worker ``w``, starting now: ``hot + f * (cold - hot)``, or with a shared
        cache ``hot + a * (near - hot) + b * (cold - hot)``."""
        k = self.kind[w]
        cold, far, total = self._touch(t, w)
        if not total:
            return self.hot[k][t] + 0.0 * self.delta[k][t]
        if self.llc[w] > 0.0:
            return self.hot[k][t] + ((cold - far) / total) * self.near_delta[k][t] + (far / total) * self.delta[k][t]
        return self.hot[k][t] + (cold / total) * self.delta[k][t]


def native_inputs(lanes, graph, worker_kind) -> dict:
    """What the C loop reads for the same model (tilecast/simulator/native.py): the lanes, each worker's cache,
    the accesses, and its scratch state (counters, last worker and counter per tile), as arrays."""
    kind = [int(k) for k in worker_kind]
    from tilecast.perfmodel.reuse import step_bytes

    shared = lanes.far is not None
    return {"hot": np.ascontiguousarray(np.atleast_2d(lanes.hot), dtype=np.float64),
            "delta": np.ascontiguousarray(np.atleast_2d(lanes.delta), dtype=np.float64),
            "near_delta": np.ascontiguousarray(np.atleast_2d(lanes.near_delta if shared else lanes.delta),
                                               dtype=np.float64),
            "cache": np.array([float(lanes.cache_bytes[k]) for k in kind], dtype=np.float64),
            "llc": np.array([float(lanes.llc_bytes[k]) if shared else 0.0 for k in kind], dtype=np.float64),
            "step_bytes": np.array([step_bytes(graph)], dtype=np.int64),
            "total": np.zeros(1, dtype=np.int64),
            "last_total": np.zeros(len(graph.tile_nbytes), dtype=np.int64),
            "acc_ptr": np.ascontiguousarray(graph.acc_ptr, dtype=np.int64),
            "acc_tile": np.ascontiguousarray(graph.acc_tile, dtype=np.int64),
            "tile_bytes": np.ascontiguousarray(graph.tile_nbytes, dtype=np.int64),
            "count": np.zeros(len(kind), dtype=np.int64),
            "last_worker": np.full(len(graph.tile_nbytes), -1, dtype=np.int32),
            "last_count": np.zeros(len(graph.tile_nbytes), dtype=np.int64)}
