"""Execute a whole graph on StarPU: tiles registered in place, tasks submitted from C in one call.

StarPU derives the dependencies from the submission order and the access
modes, exactly as :attr:`tilecast.graph.Graph.dependencies` does. Per-task
start/end/worker come from StarPU's profiling info, read in a C callback
into arrays that become the trace in one go.
"""

from __future__ import annotations

import numpy as np

from tilecast.executor.starpu_native import glue
from tilecast.kernels import all_kernels
from tilecast.trace import make_trace

WAIT_SLICE_MS = 100  # Python regains control this often while StarPU runs (Ctrl-C)


def _tile_arrays(graph, store):
    """Pointers, element counts and element sizes of every tile buffer (checked against the graph)."""
    floats = {t.dtype for t in graph.tensors if t.dtype.kind == "f"}
    if floats - {np.dtype(np.float32)}:
        raise ValueError(f"the StarPU executor runs float32 graphs only (this one has {sorted(map(str, floats))})")
    if any(b is None for b in store.buffers):
        store.allocate_all()
    bufs = store.buffers
    n = graph.n_tiles
    ok = np.fromiter((b.flags.c_contiguous and b.flags.writeable for b in bufs), dtype=bool, count=n)
    nbytes = np.fromiter((b.nbytes for b in bufs), dtype=np.int64, count=n)
    itemsize = np.fromiter((b.itemsize for b in bufs), dtype=np.int64, count=n)
    want_itemsize = np.array([t.dtype.itemsize for t in graph.tensors], dtype=np.int64)[graph.tile_tensor]
    for t in graph.tensors:  # one dtype comparison per tensor, not per tile, unless one differs
        tiles = bufs[t.first_tile:t.first_tile + t.n_tiles]
        if any(b.dtype != t.dtype for b in tiles):
            ok[t.first_tile:t.first_tile + t.n_tiles] &= np.array([b.dtype == t.dtype for b in tiles])
    bad = np.flatnonzero(~ok | (nbytes != graph.tile_nbytes) | (itemsize != want_itemsize))
    if len(bad):
        tid = int(bad[0])
        t = graph.tensors[graph.tile_tensor[tid]]
        raise ValueError(f"tile {tid} of tensor {t.name!r}: buffer must be a contiguous, writeable "
                         f"{t.dtype} array of {graph.tile_nbytes[tid]} bytes")
    ptrs = np.fromiter((b.__array_interface__["data"][0] for b in bufs), dtype=np.uint64, count=n)
    ptrs[nbytes == 0] = 0
    return ptrs, nbytes // np.maximum(itemsize, 1), itemsize


class _Registered:
    """Tile handles registered for one run; unregistered on exit (data stays in the numpy buffers)."""

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


def _graph_arrays(graph):
    return dict(
        kernel=np.ascontiguousarray(graph.kernel, dtype=np.int16),
        param_ptr=np.ascontiguousarray(graph.param_ptr, dtype=np.int64),
        params=np.ascontiguousarray(graph.params, dtype=np.float64),
        acc_ptr=np.ascontiguousarray(graph.acc_ptr, dtype=np.int64),
        acc_tile=np.ascontiguousarray(graph.acc_tile, dtype=np.int32),
        acc_mode=np.ascontiguousarray(graph.acc_mode, dtype=np.int8),
    )


def execute_graph(session, graph, store, dry: bool = False, submit_paused: bool = False, trace: bool = True):
    g = glue()
    lib, f = g.lib, g.ffi.from_buffer
    n = graph.n_tasks
    a = _graph_arrays(graph)
    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    worker = np.full(n, -1, dtype=np.int32)
    err = g.ffi.new("int *")
    submitted = 0
    with _Registered(graph, store) as handles:
        try:
            submitted = lib.tcs_submit(
                n, f("int16_t[]", a["kernel"]), f("int64_t[]", a["param_ptr"]), f("double[]", a["params"]),
                f("int64_t[]", a["acc_ptr"]), f("int32_t[]", a["acc_tile"]), f("int8_t[]", a["acc_mode"]), handles,
                (lib.TCS_DRY if dry else 0) | (lib.TCS_SUBMIT_PAUSED if submit_paused else 0),
                f("double[]", start), f("double[]", end), f("int32_t[]", worker), err)
            while lib.tcs_wait(WAIT_SLICE_MS) < submitted:
                pass
        except BaseException:
            lib.tcs_abort()  # remaining tasks skip their kernels, so that StarPU drains quickly
            raise
        finally:
            lib.tcs_finish()  # waits for every submitted task and releases them (tracked in C)
    if err[0] != 0:
        raise RuntimeError(f"StarPU refused task {submitted} ({all_kernels()[a['kernel'][submitted]].name}): "
                           f"error {err[0]}")
    if not trace:
        return None
    names = np.array([k.name for k in all_kernels()], dtype=object)
    return make_trace(
        task=np.arange(n, dtype=np.int64), kernel=names[a["kernel"]], worker=worker.astype(np.int64),
        node=session.worker_nodes[np.maximum(worker, 0)], start_s=start, end_s=end,
        bytes=np.asarray(graph.bytes, dtype=np.int64), flops=graph.flops, source="real",
        tag=np.array(graph.tags, dtype=object)[graph.tag] if n else np.zeros(0, dtype=object),
    )


def baseline_graph(session, graph, store) -> float:
    g = glue()
    f = g.ffi.from_buffer
    a = _graph_arrays(graph)
    with _Registered(graph, store) as handles:
        return float(g.lib.tcs_baseline(graph.n_tasks, f("int64_t[]", a["acc_ptr"]), f("int32_t[]", a["acc_tile"]),
                                        f("int8_t[]", a["acc_mode"]), handles))
