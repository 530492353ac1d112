"""Execute a whole graph on StarPU: tiles registered in place, tasks submitted from C in one call.

StarPU derives the dependencies from the submission order and the access
modes, exactly as :attr:`tilecast.graph.Graph.dependencies` does. Per-task
start/end/worker come from StarPU's profiling info, read in a C callback
into arrays that become the trace in one go. Policies that order by priority
get each task's priority (:func:`graph_priorities`), the same as the
simulation of that policy assumes.
"""

from __future__ import annotations

import time

import numpy as np

from tilecast.executor.starpu_native import glue
from tilecast.graph.priorities import USES_PRIORITIES, bottom_level, starpu_priorities
from tilecast.kernels import all_kernels
from tilecast.trace import make_trace

WAIT_SLICE_MS = 100  # Python regains control this often while StarPU runs (Ctrl-C)


def _tile_buffers(graph, store) -> list:
    """The store's buffers, allocating missing ones (float32 graphs only)."""
    floats = {t.dtype for t in graph.tensors if t.dtype.kind == "f"}
    if floats - {np.dtype(np.float32)}:
        raise ValueError(f"the StarPU executor runs float32 graphs only (this one has {sorted(map(str, floats))})")
    if any(b is None for b in store.buffers):
        store.allocate_all()
    return store.buffers


def _addresses(bufs, idx) -> tuple[np.ndarray, np.ndarray]:
    """Data addresses and byte sizes of buffers ``idx``."""
    ptrs = np.fromiter((bufs[i].__array_interface__["data"][0] for i in idx.tolist()), np.uint64, len(idx))
    nbytes = np.fromiter((bufs[i].nbytes for i in idx.tolist()), np.int64, len(idx))
    return ptrs, nbytes


def _check_tiles(graph, bufs, nbytes, idx) -> tuple[np.ndarray, np.ndarray]:
    """Element counts and sizes (arrays over all tiles, filled at ``idx``) after checking dtype, size
    and layout of tiles ``idx`` against the graph; ``nbytes`` is indexed by tile id."""
    tensors, tile_tensor, tile_nbytes = graph.tensors, graph.tile_tensor, graph.tile_nbytes
    nelem = np.zeros(len(bufs), dtype=np.int64)
    elemsize = np.zeros(len(bufs), dtype=np.int64)
    for tid in idx.tolist():
        b, t = bufs[tid], tensors[tile_tensor[tid]]
        if (b.dtype != t.dtype or not b.flags.c_contiguous or not b.flags.writeable
                or nbytes[tid] != tile_nbytes[tid]):
            raise ValueError(f"tile {tid} of tensor {t.name!r}: buffer must be a contiguous, writeable "
                             f"{t.dtype} array of {tile_nbytes[tid]} bytes")
        nelem[tid] = b.size
        elemsize[tid] = b.itemsize
    return nelem, elemsize


def _tile_arrays(graph, store):
    """Pointers, element counts and element sizes of every tile buffer (checked against the graph)."""
    bufs = _tile_buffers(graph, store)
    idx = np.arange(len(bufs))
    ptrs, nbytes = _addresses(bufs, idx)
    nelem, elemsize = _check_tiles(graph, bufs, np.asarray(nbytes), idx)
    ptrs[nbytes == 0] = 0
    return ptrs, nelem, elemsize


class _Registered:
    """Tile handles registered for one call; unregistered on exit (data stays in the numpy buffers)."""

    def __init__(self, graph, store):
        self.g = glue()
        ptrs, nelem, elemsize = _tile_arrays(graph, store)
        self.n = len(ptrs)
        self.handles = self.g.ffi.new("void *[]", max(self.n, 1))
        f = self.g.ffi.from_buffer
        self.g.lib.tcs_register(self.n, f("uint64_t[]", ptrs), f("int64_t[]", nelem), f("int64_t[]", elemsize),
                                self.handles)

    def __enter__(self):
        return self.handles

    def __exit__(self, *exc):
        self.g.lib.tcs_unregister(self.n, self.handles)


class TileHandles:
    """StarPU handles of a store's tiles, kept registered from one execution to the next.

    A training loop executes the same graph on the same store step after step;
    registering and unregistering every tile each time would cost StarPU
    several microseconds per tile. Tiles whose buffer changed (a new array, as
    ``TileStore.set_tensor`` makes) are re-registered one by one. Between
    executions the buffers stay plain numpy arrays: StarPU keeps no other copy
    of them (CPU workers only, data registered in main memory).
    """

    def __init__(self):
        self.g = glue()
        self.key = None
        self.handles = None
        self.state = None
        self.last_registered = 0  # tiles (re-)registered by the last update

    def update(self, graph, store):
        """Handles for every tile of ``store``; only new buffer objects are checked and registered.

        The buffers registered are referenced here until they are replaced, so
        their memory cannot be reused while StarPU holds a handle on it.
        Buffers must not be resized in place.
        """
        bufs = _tile_buffers(graph, store)
        n = len(bufs)
        key = (id(graph), id(store), n)
        if key != self.key:
            self.release()
            self.handles = self.g.ffi.new("void *[]", max(n, 1))
            changed = np.arange(n, dtype=np.int64)
        else:
            changed = np.flatnonzero(np.fromiter((a is not b for a, b in zip(bufs, self.state)), bool, n))
        if len(changed):
            ptrs, nbytes = np.zeros(n, np.uint64), np.zeros(n, np.int64)
            ptrs[changed], nbytes[changed] = _addresses(bufs, changed)
            nelem, elemsize = _check_tiles(graph, bufs, nbytes, changed)
            ptrs[nbytes == 0] = 0
            f = self.g.ffi.from_buffer
            changed = np.ascontiguousarray(changed, dtype=np.int64)
            self.g.lib.tcs_reregister_at(len(changed), f("int64_t[]", changed), f("uint64_t[]", ptrs),
                                         f("int64_t[]", nelem), f("int64_t[]", elemsize), self.handles)
        self.key = key
        self.state = list(bufs)
        self.last_registered = len(changed)
        return self.handles

    def release(self) -> None:
        """Unregister every handle (before StarPU shuts down, or for another store)."""
        if self.handles is not None and self.key is not None:
            self.g.lib.tcs_unregister(self.key[2], self.handles)
        self.key = self.handles = self.state = None


def _graph_arrays(graph):
    return dict(
        kernel=np.ascontiguousarray(graph.kernel, dtype=np.int16),
        param_ptr=np.ascontiguousarray(graph.param_ptr, dtype=np.int64),
        params=np.ascontiguousarray(graph.params, dtype=np.float64),
        acc_ptr=np.ascontiguousarray(graph.acc_ptr, dtype=np.int64),
        acc_tile=np.ascontiguousarray(graph.acc_tile, dtype=np.int32),
        acc_mode=np.ascontiguousarray(graph.acc_mode, dtype=np.int8),
    )


def local_priority_weights(graph) -> np.ndarray:
    """Per-task weights of the default priorities: what ``tilecast simulate --machine local`` simulates,
    the local machine's duration model (its stored calibration, else the roofline) on the fastest kind,
    plus the machine's cost per task."""
    from tilecast.perfmodel.calibration import find_calibration
    from tilecast.perfmodel.kernel_model import DurationModel
    from tilecast.perfmodel.local import detect_local

    machine = detect_local()
    durations = DurationModel(machine, find_calibration(machine)).durations(graph)
    return np.atleast_2d(durations).min(axis=0) + machine.task_overhead


def graph_priorities(session, graph, priority=None) -> np.ndarray | None:
    """The int32 priorities to give StarPU for ``graph`` under the session's policy, or None (all 0).

    Policies that order by priority (:data:`tilecast.graph.priorities.USES_PRIORITIES`) get the
    bottom levels of ``priority`` (per-task weights, e.g. the durations a simulation used) or, by
    default, of :func:`local_priority_weights`, mapped into the range the running policy declares:
    the same function the simulator calls (:func:`tilecast.graph.priorities.task_priorities`).
    Computed once per graph and session.
    """
    if session.sched not in USES_PRIORITIES:
        return None
    cached = session.priority_cache
    if priority is None and cached is not None and cached[0] is graph and cached[1] == graph.n_tasks:
        return cached[2]
    lo, hi = session.priority_range
    weights = local_priority_weights(graph) if priority is None else np.asarray(priority, dtype=np.float64)
    if len(weights) != graph.n_tasks:
        raise ValueError(f"priority weights for {len(weights)} tasks, the graph has {graph.n_tasks}")
    pred_ptr, pred = graph.dependencies
    prio = np.ascontiguousarray(starpu_priorities(bottom_level(weights, pred_ptr, pred), lo, hi), dtype=np.int32)
    if priority is None:
        session.priority_cache = (graph, graph.n_tasks, prio)
    return prio


def execute_graph(session, graph, store, dry: bool = False, submit_paused: bool = False, trace: bool = True,
                  priority=None):
    entered = time.perf_counter()
    g = glue()
    lib, f = g.lib, g.ffi.from_buffer
    n = graph.n_tasks
    a = _graph_arrays(graph)
    prio = graph_priorities(session, graph, priority)
    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    worker = np.full(n, -1, dtype=np.int32)
    err = g.ffi.new("int *")
    submitted = 0
    managed = getattr(store, "handles", None)  # a ManagedTileStore's StarPU-owned tiles
    handles = managed if managed is not None else session.tile_handles.update(graph, store)
    if session.memory is not None:
        submit_paused = False  # throttled submission blocks until tasks finish: the workers must run
    try:
        called = time.perf_counter()
        submitted = lib.tcs_submit(
            n, f("int16_t[]", a["kernel"]), f("int64_t[]", a["param_ptr"]), f("double[]", a["params"]),
            f("int64_t[]", a["acc_ptr"]), f("int32_t[]", a["acc_tile"]), f("int8_t[]", a["acc_mode"]), handles,
            g.ffi.NULL if prio is None else f("int32_t[]", prio),
            (lib.TCS_DRY if dry else 0) | (lib.TCS_SUBMIT_PAUSED if submit_paused else 0),
            f("double[]", start), f("double[]", end), f("int32_t[]", worker), err)
        returned = time.perf_counter()
        while lib.tcs_wait(WAIT_SLICE_MS) < submitted:
            pass
        waited = time.perf_counter()
    except BaseException:
        lib.tcs_abort()  # remaining tasks skip their kernels, so that StarPU drains quickly
        raise
    finally:
        lib.tcs_finish()  # waits for every submitted task and releases them (tracked in C)
    if err[0] != 0:
        raise RuntimeError(f"StarPU refused task {submitted} ({all_kernels()[a['kernel'][submitted]].name}): "
                           f"error {err[0]}")
    session.tasks_done_at = time.perf_counter()  # a step's end, before the trace (instrumentation) is built
    session.last_makespan_s = float(np.nanmax(end)) if n else 0.0  # submission to the last task's end
    session.last_submit_s = float(lib.tcs_submit_seconds())  # the submitting thread's time for the graph
    session.last_marks = step_marks(lib, g.ffi, entered, called, returned, waited, session.tasks_done_at, start, end)
    if not trace:
        return None
    names = np.array([k.name for k in all_kernels()], dtype=object)
    return make_trace(
        task=np.arange(n, dtype=np.int64), kernel=names[a["kernel"]], worker=worker.astype(np.int64),
        node=session.worker_nodes[np.maximum(worker, 0)], start_s=start, end_s=end,
        bytes=np.asarray(graph.bytes, dtype=np.int64), flops=graph.flops, source="real",
        tag=np.array(graph.tags, dtype=object)[graph.tag] if n else np.zeros(0, dtype=object),
    )


def step_marks(lib, ffi, entered, called, returned, waited, done, start, end) -> dict:
    """The last execution's timeline, seconds on perf_counter's clock (StarPU's is the same, CLOCK_MONOTONIC):
    the call entered, the submitting call made and returned, the wait returned in Python, the call's end
    (``done``); from the glue, the submission loop's start (the makespan's origin) and end, the last
    task's callback, the waiting thread woken, the workers paused, StarPU's wait for all tasks returned;
    from the tasks, the first start and the last end."""
    c = ffi.new("double[6]")
    lib.tcs_marks(c)
    origin = c[0]
    finite = np.isfinite(start)
    return {"entered": entered, "submit_called": called, "origin": origin, "submit_loop_end": c[1],
            "submit_returned": returned,
            "first_start": origin + float(start[finite].min()) if finite.any() else float("nan"),
            "last_end": origin + float(np.nanmax(end)) if finite.any() else float("nan"),
            "last_callback": c[2], "woken": c[3], "wait_returned": waited, "paused": c[4], "all_done": c[5],
            "done": done}


def baseline_graph(session, graph, store, profiling: bool = False) -> float:
    g = glue()
    f = g.ffi.from_buffer
    a = _graph_arrays(graph)
    with _Registered(graph, store) as handles:
        return float(g.lib.tcs_baseline(graph.n_tasks, f("int64_t[]", a["acc_ptr"]), f("int32_t[]", a["acc_tile"]),
                                        f("int8_t[]", a["acc_mode"]), handles, int(profiling)))
