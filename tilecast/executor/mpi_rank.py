"""One rank of a StarPU-MPI run: ``python -m tilecast.executor.mpi_rank SPEC.json``, started by ``mpirun``.

Every rank builds the same graph, the same initial state and the same
batches (same seed), registers every tile with its owner rank, and submits
every task with ``starpu_mpi_task_insert`` (``c/starpu_mpi_glue.c``);
StarPU-MPI runs each task on one rank and moves the tiles it needs. A rank
keeps only its own tiles up to date. At the end each rank writes
``rank<R>.npz`` into the run directory: its step times, bytes sent, the
executing times of its tasks in the last step, and (with ``check``) its
owned tiles after the first step. A failure is one line on standard error,
``tilecast rank R: ...``, and a non-zero exit, on which ``mpirun`` ends the
other ranks; a rank that outlives ``timeout_s`` ends itself.
"""

from __future__ import annotations

import faulthandler
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np

from tilecast.atomic_file import atomic_write

RESULT = "rank{}.npz"


def local_rank() -> int:
    """This process's rank among those of its machine, from the launcher's environment (Open MPI, MPICH)."""
    for var in ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


def set_binding(workers: int, ranks_here: int, drive: bool = True) -> bool:
    """Give each rank's workers their own cores when there are enough, else let the system place them
    (StarPU 1.3 binds worker i of every process to core i otherwise: all ranks on the same cores); with
    ``drive``, let the progress thread run worker 0 where the threads would outnumber the cores
    (:mod:`tilecast.executor.mpi_threads`). Returns whether it does."""
    from tilecast.executor.mpi_threads import set_mpi_threads

    cores = os.cpu_count() or 1
    os.environ["STARPU_MPI_NOBIND"] = "1"  # the MPI progress thread: no core of its own to take
    drives = set_mpi_threads(workers, ranks_here, cores) if drive else set_mpi_threads(workers, 0, cores)
    first = first_own_core(workers, ranks_here)
    if first is not None:
        os.environ["STARPU_WORKERS_CPUID"] = " ".join(str(first + i) for i in range(workers))
    else:
        os.environ["STARPU_WORKERS_NOBIND"] = "1"
    return drives


def first_own_core(workers: int, ranks_here: int) -> int | None:
    """The first of this rank's own cores (its workers', one each), or None where the ranks' workers outnumber
    the cores and share them all."""
    if workers * ranks_here > (os.cpu_count() or 1):
        return None
    return local_rank() * workers


def own_tiles(graph, store, owner: np.ndarray, me: int):
    """Keep only this rank's tiles in ``store`` (and the batch's, rewritten in place every step), allocating
    those missing; returns (pointers, 0 for other ranks' tiles; element counts; element sizes) for
    tcsm_register, which gives other ranks' tiles no home buffer (StarPU allocates them when they arrive)."""
    n = graph.n_tiles
    itemsize = np.array([graph.tensors[t].dtype.itemsize for t in graph.tile_tensor.tolist()], dtype=np.int64)
    nelem = graph.tile_nbytes // itemsize
    inputs = np.array([t.kind == "input" for t in graph.tensors])[graph.tile_tensor]
    ptrs = np.zeros(n, dtype=np.uint64)
    for i in range(n):
        if owner[i] != me:
            if not inputs[i]:
                store.buffers[i] = None
            continue
        b = store.buffers[i]
        if b is None:
            b = store.buffers[i] = np.empty(int(nelem[i]), dtype=graph.tensors[graph.tile_tensor[i]].dtype)
        if b.nbytes != graph.tile_nbytes[i] or not b.flags.c_contiguous:
            raise RuntimeError(f"tile {i}: buffer of {b.nbytes} bytes, the graph says {graph.tile_nbytes[i]}")
        ptrs[i] = b.__array_interface__["data"][0]
    return ptrs, nelem, itemsize


def _batches(spec: dict, cfg, steps: int, train):
    """(the steps' (ids, targets), the sampler or None, steps already done): random tokens for a timed run,
    the byte corpus's batches for training (the sampler as a resumed checkpoint left it)."""
    if not train:
        data = np.random.default_rng(spec["seed"]).integers(0, cfg.vocab_size,
                                                            size=(steps, spec["batch"], spec["seq"] + 1))
        return [(data[t, :, :-1], data[t, :, 1:]) for t in range(steps)], None, 0
    from tilecast.data.corpus import BatchSampler, load_corpus
    from tilecast.data.mpi_checkpoint import read_manifest

    sampler = BatchSampler(load_corpus().train, spec["batch"], spec["seq"], seed=spec["seed"])
    start = 0
    if train.get("resume"):
        m = read_manifest(train["folder"], train["settings"])
        sampler.set_state(m["sampler_state"])
        start = int(m["step"])
    states, out = [], []
    for _ in range(steps):
        states.append(sampler.state())
        out.append(sampler.next())
    sampler.states = states + [sampler.state()]  # the state before each step, and after the last
    return out, sampler, start


def _checkpoint(lib, train, graph, store, owner, me, size, step, sampler_state) -> None:
    """Every rank its shard, then rank 0 the manifest, then the old shards go (tilecast.data.mpi_checkpoint)."""
    from tilecast.data.mpi_checkpoint import remove_old_shards, save_shard, write_manifest

    folder = train["folder"]
    entry = save_shard(folder, me, step, graph, store, owner)
    lib.tcsm_barrier()
    if me == 0:
        from tilecast.data.mpi_checkpoint import SHARD, _digest

        shards = []
        for r in range(size):
            name = SHARD.format(rank=r, step=step)
            with np.load(Path(folder) / name) as z:
                shards.append({"rank": r, "file": name, "tiles": int(len(z["tiles"])),
                               "sha256": _digest(z["tiles"], z["values"])})
        assert shards[0]["sha256"] == entry["sha256"]
        write_manifest(folder, train["settings"], step, sampler_state, shards)
    lib.tcsm_barrier()
    remove_old_shards(folder, me, step)


def _thread_arrays(threads: list, main_tid: int) -> dict:
    """The per-step thread readings as arrays for the result file: ``thread_name`` (the main thread's is
    ``main``), ``thread_run_s`` and ``thread_wait_s`` (steps, threads)."""
    tids = sorted({tid for step in threads for tid in step})
    names = [("main" if tid == main_tid else next(s[tid][0] for s in threads if tid in s)) for tid in tids]
    run = np.array([[s.get(tid, ("", 0.0, 0.0))[1] for tid in tids] for s in threads]).reshape(len(threads), len(tids))
    wait = np.array([[s.get(tid, ("", 0.0, 0.0))[2] for tid in tids] for s in threads]).reshape(len(threads), len(tids))
    return dict(thread_name=np.array(names, dtype=str), thread_run_s=run, thread_wait_s=wait)


def run_rank(spec: dict, bottom=None) -> None:
    """Run this rank's part of the steps ``spec`` describes (see :func:`tilecast.executor.mpi_launch._spec`);
    ``bottom``: the tasks' bottom levels, whose order becomes their priorities under the policies that use
    them (computed once by the launcher, tilecast.graph.priorities)."""
    from tilecast.executor.mpi_native import mpi_glue
    from tilecast.executor.starpu_execute import _graph_arrays
    from tilecast.executor.starpu_session import priority_environment, starpu_home
    from tilecast.reference.step import TrainState, init_params, load_step, set_batch
    from tilecast.graph.distribution import prepare
    from tilecast.graph.gpt2 import AdamWConfig
    from tilecast.graph.model_config import load_model
    from tilecast.graph.models import build_step
    from tilecast.graph.priorities import USES_PRIORITIES, starpu_priorities
    from tilecast.graph.tiling import Tiling
    from tilecast.kernels import all_kernels
    from tilecast.kernels.native import kernel_addresses

    cfg = load_model(json.dumps(spec["model"]))
    graph = build_step(cfg, spec["batch"], spec["seq"], Tiling.parse(spec["tiling"]), AdamWConfig(lr=spec["lr"]),
                       recompute=spec.get("recompute", "none"))
    ranks, steps = spec["ranks"], spec["steps"]
    graph, dist = prepare(graph, ranks, spec["distribution"])
    owner = dist.owner
    state = TrainState(init_params(cfg, spec["seed"]))
    train = spec.get("train")
    batches, sampler, done = _batches(spec, cfg, steps, train)
    store = load_step(graph, state, *batches[0])
    del state  # the full parameters: from here on this rank holds only its own tiles (own_tiles)

    home = starpu_home()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["STARPU_HOME"] = str(home)
    os.environ.setdefault("STARPU_SILENT", "1")
    os.environ["STARPU_COMM_STATS"] = "1"
    set_binding(spec["workers"], spec["ranks_per_host"], spec.get("progress", "auto") == "auto")
    addresses = kernel_addresses()  # one BLAS thread per worker
    g = mpi_glue()
    lib, ffi, f = g.lib, g.ffi, g.ffi.from_buffer
    with priority_environment(spec["sched"]):  # the range tilecast declares (dmdasd), as a single process does
        ret = lib.tcsm_start(spec["sched"].encode(), spec["workers"])
    if ret != 0:
        raise RuntimeError(f"StarPU-MPI failed to start (sched={spec['sched']}, workers={spec['workers']}): {ret}")
    drives = bool(lib.tcsm_progress_drives_worker())
    first = first_own_core(spec["workers"], spec["ranks_per_host"])
    main_first = bool(spec.get("main_first", True)) and first is not None
    if main_first:  # StarPU's threads exist now; later ones inherit the main thread's level
        from tilecast.executor.mpi_threads import main_thread_first

        main_thread_first(first)
    # No shutdown on a failure: its barrier would wait for ranks that are gone (main() exits at once).
    me, size = lib.tcsm_rank(), lib.tcsm_size()
    if size != ranks:
        raise RuntimeError(f"started with {size} MPI processes, the run asks for {ranks} ranks")
    if train and train.get("resume"):
        from tilecast.data.mpi_checkpoint import load_shard, read_manifest

        load_shard(train["folder"], read_manifest(train["folder"]), me, graph, store, owner)
    set_batch(graph, store, *batches[0], done + 1)
    ptrs, nelem, elemsize = own_tiles(graph, store, owner, me)
    kernels = all_kernels()
    names = [ffi.new("char[]", k.name.encode()) for k in kernels]
    ret = lib.tcs_set_kernels(len(kernels), f("uint64_t[]", addresses), ffi.new("const char *[]", names),
                              ffi.new("int[]", [len(k.buffers) for k in kernels]))
    if ret != 0:
        raise RuntimeError(f"setting up StarPU codelets failed: {os.strerror(-ret)}")
    owner32 = np.ascontiguousarray(owner, dtype=np.int32)
    handles = ffi.new("void *[]", max(graph.n_tiles, 1))
    lib.tcsm_register(graph.n_tiles, f("uint64_t[]", ptrs), f("int64_t[]", nelem), f("int64_t[]", elemsize),
                      f("int32_t[]", owner32), handles)
    prio = None
    if spec["sched"] in USES_PRIORITIES and bottom is not None:
        if len(bottom) != graph.n_tasks:
            raise RuntimeError(f"{len(bottom)} bottom levels for {graph.n_tasks} tasks")
        lo, hi = ffi.new("int *"), ffi.new("int *")
        lib.tcsm_priority_range(lo, hi)
        prio = np.ascontiguousarray(starpu_priorities(bottom, lo[0], hi[0]), dtype=np.int32)
    n = graph.n_tasks
    step_s, sent, executed, losses, snapshot, submit_s = [], [], [], [], None, []
    submit_cpu_s = []  # the main thread's CPU time while it submits (time.thread_time): what it asks of a core
    amounts = ffi.new("size_t[]", size)
    loss_tile = graph.tensor("loss").first_tile
    start, end, worker = np.full(n, np.nan), np.full(n, np.nan), np.full(n, -1, dtype=np.int32)
    err = ffi.new("int *")
    # when each insertion of the step returned (the last step's are kept): the submission's cost per task
    submit_at = np.full(n + 1, np.nan)
    submit_at_c = f("double[]", submit_at)
    lib.tcsm_record_submit(submit_at_c)
    t0_first = None
    clock_us = []
    from tilecast.executor.mpi_threads import thread_deltas, thread_times

    threads, submitting = [], []  # the same until the submission's end; per step: {tid: (name, s on a core, s waiting for one)} from the barrier's exit to wait_all's end
    main_tid = threading.get_native_id()
    read = bool(spec.get("read_threads"))  # a reading costs 0.1-0.3 ms of the main thread, inside the step
    for t in range(steps):
        if t:
            set_batch(graph, store, *batches[t], done + t + 1)  # in place: handles stay
            lib.tcsm_flush_cache()  # copies of the old batch elsewhere are stale
        a = _graph_arrays(graph)
        start[:], end[:], worker[:] = np.nan, np.nan, -1
        before, done_before = list(amounts), lib.tcsm_executed()
        t0 = lib.tcsm_barrier()
        clock_us.append(lib.tcsm_clock_offset_us())  # this step's trace time + it = CLOCK_MONOTONIC, shared by the host's ranks
        t0_first = t0 if t0_first is None else t0_first
        th0 = thread_times() if read else None
        s0, c0 = time.perf_counter(), time.thread_time()
        submitted = lib.tcsm_submit(
            n, f("int16_t[]", a["kernel"]), f("int64_t[]", a["param_ptr"]), f("double[]", a["params"]),
            f("int64_t[]", a["acc_ptr"]), f("int32_t[]", a["acc_tile"]), f("int8_t[]", a["acc_mode"]),
            handles, ffi.NULL if prio is None else f("int32_t[]", prio), f("double[]", start),
            f("double[]", end), f("int32_t[]", worker), err)
        submit_s.append(time.perf_counter() - s0)
        submit_cpu_s.append(time.thread_time() - c0)
        if read:
            submitting.append(thread_deltas(th0, thread_times()))
        t1 = lib.tcsm_wait_all()
        if read:
            threads.append(thread_deltas(th0, thread_times()))
        if err[0] != 0:
            raise RuntimeError(f"StarPU-MPI refused task {submitted} "
                               f"({kernels[a['kernel'][submitted]].name}): error {err[0]}")
        lib.tcsm_comm_amounts(amounts)
        step_s.append((t1 - t0) * 1e-6)
        sent.append([int(x) - int(y) for x, y in zip(amounts, before)])
        executed.append(int(lib.tcsm_executed() - done_before))
        if owner[loss_tile] == me:
            losses.append(float(store.buffers[loss_tile][0]))
        every = (train or {}).get("every") or 0
        if train and train.get("folder") and (t == steps - 1 or (every and (done + t + 1) % every == 0)):
            _checkpoint(lib, train, graph, store, owner, me, size, done + t + 1, sampler.states[t + 1])
        if t == 0 and spec["check"]:
            mine = np.flatnonzero(owner == me)
            snapshot = (mine, np.concatenate([store.buffers[i].astype(np.float64) for i in mine]))
    lib.tcsm_record_submit(ffi.NULL)
    ran = np.flatnonzero(worker >= 0)
    out = dict(rank=me, step_s=np.array(step_s), submit_s=np.array(submit_s), submit_cpu_s=np.array(submit_cpu_s), sent=np.array(sent, dtype=np.int64),
               executed=np.array(executed), losses=np.array(losses), task=ran, start_us=start[ran],
               end_us=end[ran], worker=worker[ran], t0_us=np.array([t0]), t0_first_us=np.array([t0_first]),
               clock_offset_us=np.array(clock_us), host=np.array([socket.gethostname()]),
               submit_at_us=submit_at,
               drives=np.array([drives]), main_first=np.array([main_first]))
    if read:
        out.update(_thread_arrays(threads, main_tid),
                   **{"submit_" + k: v for k, v in _thread_arrays(submitting, main_tid).items()})
    if snapshot is not None:
        out["owned"], out["owned_values"] = snapshot
    path = Path(spec["run_dir"]) / RESULT.format(me)
    with atomic_write(path) as f:  # rank 0 reads it whole or not at all
        np.savez(f, **out)
    lib.tcsm_unregister(graph.n_tiles, handles)
    lib.tcsm_barrier()  # every rank's file is written (a user-started mpirun: rank 0 reads them next)
    lib.tcsm_stop()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    # A backstop: the launcher ends the run at timeout_s; a rank never outlives it by long (an mpirun gone astray).
    faulthandler.dump_traceback_later(spec["timeout_s"] + 20, exit=True)
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "?"))
    try:
        bottom = np.load(spec["bottom_level"]) if spec.get("bottom_level") else None
        run_rank(spec, bottom)
    except Exception as e:  # one line; mpirun then ends every rank
        print(f"tilecast rank {rank}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(1)  # without MPI_Finalize or StarPU's shutdown, which would wait for the other ranks
    return 0


if __name__ == "__main__":
    sys.exit(main())
