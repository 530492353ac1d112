"""The simulator's run loop in C: every policy of :data:`tilecast.simulator.simulate.POLICIES`.

``c/tcsim.c`` restates the Python engine (:class:`~tilecast.simulator.engine.Engine`
with the policies of :mod:`tilecast.simulator.policies`,
:class:`~tilecast.simulator.memory.Memory` and
:class:`~tilecast.simulator.links.Links`) step for step, with the same double
operations in the same order (no ``-ffast-math``, ``-ffp-contract=off``), so
the results are equal bit for bit: tests/test_sim_native.py compares the two
on random graphs and machines for every policy. A gpt2-xl step of two million
tasks simulates in seconds instead of minutes (``benchmarks/simulator_speed.py``).

The extension is built with cffi and cached under ``$TILECAST_HOME/native`` like
the C kernels (:func:`tilecast.kernels.native_build.build_extension`). Where it
cannot be built, or ``TILECAST_SIM_NATIVE=0`` is set, :func:`library` returns
None (a failed build says so once on standard error) and the simulator runs its
Python loops. The Python engine stays the readable statement of the model.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tilecast.graph.priorities import reads_queued_tasks
from tilecast.kernels.native_build import NativeUnavailable, build_extension
from tilecast.simulator.queue_costs import SEARCHING, priority_stages, walk_far_of

C_DIR = Path(__file__).parent / "c"
NAME = "_tilecast_sim"
ENV = "TILECAST_SIM_NATIVE"
# the same double operations as Python: no fast math, no fused multiply-adds
FLAGS = ["-O2", "-fno-fast-math", "-ffp-contract=off", "-std=gnu11"]
POLICY_IDS = {"eager": 0, "prio": 1, "random": 2, "ws": 3, "lws": 4, "dm": 5, "dmda": 6, "dmdas": 7, "dmdasd": 8}
MAX_NODES = 64  # replica sets are 64-bit masks
ERRORS = {1: "ENOMEM", 2: "EROOM", 3: "ENOWORKER"}

_module = None
_failed: str | None = None


def _cdef() -> str:
    text = (C_DIR / "tcsim.h").read_text()
    return "\n".join(line for line in text.splitlines() if not line.startswith("#"))


def library():
    """The compiled module (``.ffi``, ``.lib``), built on first use; None where it cannot be
    (or ``$TILECAST_SIM_NATIVE`` is 0)."""
    global _module, _failed
    if os.environ.get(ENV, "1").strip().lower() in ("0", "no", "false", "off"):
        return None
    if _module is None and _failed is None:
        try:
            _module = build_extension(NAME, _cdef(), '#include "tcsim.h"', sources=[C_DIR / "tcsim.c"],
                                      include_dirs=[str(C_DIR)], extra_compile_args=FLAGS,
                                      hint="pip install cffi; apt-get install build-essential")
        except NativeUnavailable as e:
            _failed = str(e)
            print(f"tilecast: simulating with the Python loops (slower): {_failed}", file=sys.stderr)
    return _module


def supports(sched: str, machine) -> bool:
    return sched in POLICY_IDS and len(machine.nodes) <= MAX_NODES and library() is not None


@dataclass
class MemoryStats:
    """What the summary reads of a :class:`~tilecast.simulator.memory.Memory` after a run."""
    peak: list
    n_evictions: int
    n_writebacks: int


@dataclass
class NativeRun:
    start: np.ndarray
    end: np.ndarray
    worker: np.ndarray
    transfers: dict  # as Links.arrays()
    memory: MemoryStats | None


def _ptr(ffi, ctype: str, a: np.ndarray):
    return ffi.cast(ctype, ffi.from_buffer(a)) if a is not None else ffi.NULL


def _sweep(fn: str, weights, pred_ptr, pred) -> np.ndarray | None:
    """Call the extension's sweep ``fn`` over the predecessor lists (CSR); its per-task result, or None
    without the extension."""
    mod = library()
    if mod is None:
        return None
    w = np.ascontiguousarray(weights, dtype=np.float64)
    pp, pr = np.ascontiguousarray(pred_ptr, dtype=np.int64), np.ascontiguousarray(pred, dtype=np.int32)
    out = np.zeros(len(w))
    ffi = mod.ffi
    if getattr(mod.lib, fn)(len(w), _ptr(ffi, "double *", w), _ptr(ffi, "int64_t *", pp),
                            _ptr(ffi, "int32_t *", pr), _ptr(ffi, "double *", out)):
        raise MemoryError(f"{fn}: out of memory")
    return out


def longest_path_end(weights, pred_ptr, pred) -> np.ndarray | None:
    """:func:`tilecast.graph.analysis.longest_path_end` (same result), or None without the extension."""
    return _sweep("tcsim_longest_path_end", weights, pred_ptr, pred)


def bottom_level(weights, pred_ptr, pred) -> np.ndarray | None:
    """:func:`tilecast.graph.priorities.bottom_level` (same result), or None without the extension."""
    return _sweep("tcsim_bottom_level", weights, pred_ptr, pred)


def run(graph, machine, sched: str, durations: np.ndarray, estimate, priority, choice, proximity,
        transfers: bool, gap_charges=None, cache: dict | None = None) -> NativeRun:
    """Simulate as :class:`~tilecast.simulator.engine.Engine` would with policy ``sched``.

    ``gap_charges``: (before, release) per task, as :func:`tilecast.simulator.gap_cost.charges` gives them.

    ``estimate``: the dm family's per-footprint means (else None); ``priority``:
    per-task priorities or None; ``choice``: random's worker per task; ``proximity``:
    lws's stealing order per worker (lists); ``cache``: the per-worker cache model's arrays
    (:func:`tilecast.simulator.worker_cache.native_inputs`), or None for the durations as given.
    """
    from tilecast.simulator.engine import SimulationError
    from tilecast.simulator.links import Links

    mod = library()
    ffi, lib = mod.ffi, mod.lib
    n = graph.n_tasks
    n_workers = len(machine.workers)
    if n_workers == 0:
        raise SimulationError("no workers to run the tasks on")
    n_nodes = len(machine.nodes)
    kind_index = {k: i for i, k in enumerate(machine.kind_names)}
    keep = []  # every array the C code points into, alive until it returns

    def arr(a, dtype):
        a = np.ascontiguousarray(a, dtype=dtype)
        keep.append(a)
        return a

    ctype = {np.float64: "double *", np.int64: "int64_t *", np.int32: "int32_t *", np.uint8: "uint8_t *",
             np.uint64: "uint64_t *"}

    def p(a, dtype):
        return ffi.NULL if a is None else ffi.cast(ctype[dtype], ffi.from_buffer(arr(a, dtype)))

    s = ffi.new("tcsim_t *")
    s.n_tasks, s.n_workers, s.n_nodes, s.policy = n, n_workers, n_nodes, POLICY_IDS[sched]
    dur = arr(durations, np.float64)
    s.dur = p(dur, np.float64)
    s.est = p(estimate if estimate is not None else dur, np.float64)
    s.worker_kind = p([kind_index[w.kind] for w in machine.workers], np.int32)
    s.worker_node = p([w.node for w in machine.workers], np.int32)
    s.overhead = float(machine.task_overhead)
    # a decision reads queued tasks, under their locks and one at a time, only where no priority range is declared
    # (deque_model.py, as the Python loop)
    reads = reads_queued_tasks(sched)
    s.decision_scan = float(machine.decision_scan) if reads else 0.0
    s.decision_lock, s.decision_serial = float(machine.decision_lock), int(reads)
    s.push_walk = float(machine.push_walk) if sched in SEARCHING else 0.0  # as simulate.simulate
    s.walk_far, s.walk_knee = walk_far_of(machine, sched)
    gap_before, release = gap_charges if gap_charges is not None else (None, None)
    s.gap_before, s.release = p(gap_before, np.float64), p(release, np.float64)
    s.gap_ready = float(machine.gap_ready)
    s.gap_handoff = float(machine.gap_handoff)
    slices = machine.submit_slices
    if slices is not None:  # the Engine's slices (submit_slices.py), the same release times and turns
        slices = slices.for_tasks(n)
        at = slices.release_times(n)
        s.sub_at = p(at, np.float64)
        s.sub_resume, s.sub_end = float(slices.resume_at(n)), float(at[-1]) if n else 0.0
        s.sub_first_s, s.sub_slice_s, s.sub_sharer = slices.first_s, slices.slice_s, slices.sharer
    pred_ptr, pred = graph.dependencies
    s.pred_ptr, s.pred = p(pred_ptr, np.int64), p(pred, np.int32)
    if priority is not None:
        prio = np.asarray(priority, dtype=np.float64)
        s.neg = p(-prio, np.float64)
        s.front = p(prio != 0.0, np.uint8)
    if sched == "prio" and s.push_walk > 0.0:  # its tree's stages (Prio.stages)
        s.stage = p(priority_stages(priority), np.int32)
    if choice is not None:
        s.choice = p(choice, np.int64)
    if proximity is not None:
        s.proximity = p(np.asarray(proximity, dtype=np.int32).reshape(-1), np.int32)
    if cache is not None:
        _set_worker_cache(s, cache, keep, ffi)
    start, end = np.zeros(n), np.zeros(n)
    where = np.full(n, -1, dtype=np.int64)
    s.start, s.end, s.where = p(start, np.float64), p(end, np.float64), p(where, np.int64)
    # data: what Memory.__init__ and Links.__init__ set up
    links = Links(machine)
    has_mem = transfers and n_nodes > 1
    if has_mem:
        persistent = graph.persistent_tiles()
        size = np.asarray(graph.tile_nbytes, dtype=np.int64)
        valid = arr(persistent.astype(np.uint64), np.uint64)
        used = arr([int(size[persistent].sum())] + [0] * (n_nodes - 1), np.int64)
        peak = arr(used.copy(), np.int64)
        s.has_mem, s.n_tiles, s.n_links = 1, len(size), links.n_links
        s.size, s.valid = p(size, np.int64), ffi.cast("uint64_t *", ffi.from_buffer(valid))
        s.capacity = p([float("inf")] + [float(nd.capacity) for nd in machine.nodes[1:]], np.float64)
        s.used, s.peak = ffi.cast("int64_t *", ffi.from_buffer(used)), ffi.cast("int64_t *", ffi.from_buffer(peak))
        s.acc_ptr = p(graph.acc_ptr, np.int64)
        s.acc_code = p(np.asarray(graph.acc_tile, dtype=np.int64) * 4 + graph.acc_mode, np.int64)
        is_read = (graph.acc_mode & 1).astype(bool)
        read_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(graph.access_task[is_read], minlength=n), out=read_ptr[1:])
        s.read_ptr, s.read_tile = p(read_ptr, np.int64), p(graph.acc_tile[is_read], np.int64)
        s.latency, s.inv_bw = p(links.latency, np.float64), p(links.inv_bw, np.float64)
        routes = [r for row in links.route for r in row]
        s.route_ptr = p(np.concatenate([[0], np.cumsum([len(r) for r in routes])]), np.int32)
        s.route = p([i for r in routes for i in r] or [0], np.int32)
    try:
        err = lib.tcsim_run(s)
        if err:
            what = ERRORS.get(err, str(err))
            if what == "EROOM":
                node = int(s.err_arg)
                cap = float(machine.nodes[node].capacity)
                raise SimulationError(
                    f"memory node {node} ({cap / 2**30:.3g} GiB) cannot hold the data of the tasks running on it")
            if what == "ENOWORKER":
                raise RuntimeError(f"task {int(s.err_arg)}: no worker can run it")
            raise MemoryError(f"simulation: out of memory ({what})")
        done = int(s.n_done)
        if done != n:
            raise SimulationError(
                f"{n - done} of {n} tasks never ran "
                f"(policy {sched!r} left them unscheduled or the dependencies have a cycle)")
        # a view of the C loop's log: every column is copied out before it is freed (node ids and
        # bytes are exact in float64, as in Links.arrays)
        log = np.frombuffer(ffi.buffer(s.log, 8 * s.log_n), dtype=np.float64).reshape(-1, 5) \
            if s.log_n else np.zeros((0, 5))
        tr = {"src": log[:, 0].astype(np.int64), "dst": log[:, 1].astype(np.int64),
              "bytes": log[:, 2].astype(np.int64), "start": log[:, 3].copy(), "end": log[:, 4].copy()}
        del log
        stats = MemoryStats(peak.tolist(), int(s.n_evictions), int(s.n_writebacks)) if has_mem else None
    finally:
        lib.tcsim_free(s)
    return NativeRun(start, end, where, tr, stats)


def _set_worker_cache(s, cache: dict, keep: list, ffi) -> None:
    """Point the C loop's per-worker cache fields (tcsim.h, ``wc_*``) at ``cache``'s arrays (kept alive in ``keep``)."""
    fields = {"hot": ("wc_hot", "double *"), "delta": ("wc_delta", "double *"), "cache": ("wc_cache", "double *"),
              "acc_ptr": ("wc_acc_ptr", "int64_t *"), "acc_tile": ("wc_acc_tile", "int64_t *"),
              "tile_bytes": ("wc_tile_bytes", "int64_t *"), "count": ("wc_count", "int64_t *"),
              "last_worker": ("wc_last_worker", "int32_t *"), "last_count": ("wc_last_count", "int64_t *"),
              "near_delta": ("wc_near_delta", "double *"), "llc": ("wc_llc", "double *"),
              "step_bytes": ("wc_step_bytes", "int64_t *"), "total": ("wc_total", "int64_t *"),
              "last_total": ("wc_last_total", "int64_t *")}
    for key, (field, ctype) in fields.items():
        a = cache[key]
        if not a.flags.c_contiguous:
            raise ValueError(f"cache[{key!r}]: must be C-contiguous")
        keep.append(a)
        setattr(s, field, ffi.cast(ctype, ffi.from_buffer(a)))
