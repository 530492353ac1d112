"""Which threads a StarPU-MPI rank keeps runnable, and the setting that gives it one fewer.

Debian's StarPU 1.3.10 is built with ``STARPU_NON_BLOCKING_DRIVERS``: an idle
CPU worker never sleeps, it spins (``_starpu_get_worker_task`` then
``_starpu_exponential_backoff``, ``src/drivers/driver_common/driver_common.c``:
``rep; nop`` loops, no system call). StarPU-MPI's progress thread
(``_starpu_mpi_progress_thread_func``, ``mpi/src/mpi/starpu_mpi_mpi.c``) polls
without sleeping while any request is posted, detached or waiting for its
envelope, which on a rank that submits a whole step at once is the whole step.
So a rank of ``W`` workers keeps ``W + 1`` threads runnable (its main thread
too while it submits; then it sleeps in ``starpu_task_wait_for_all``).

``STARPU_MPI_DRIVER_CALL_FREQUENCY > 0`` makes the progress thread run CPU
worker 0 itself (``_starpu_mpi_driver_init``: the worker is a
``not_launched_driver``; the progress loop calls ``starpu_driver_run_once``
``STARPU_MPI_DRIVER_TASK_FREQUENCY`` times every that many polling rounds),
so the rank keeps ``W`` threads runnable. The glue keeps that thread polling
for the whole step (``c/starpu_mpi_glue.c``: the loop runs the driver only
while a receive waits for its envelope). StarPU 1.3.10 has no polling sleep
for the progress thread (``STARPU_MPI_POLLING_SLEEP`` is not read by it).

:func:`progress_drives_worker` is the rule ``run --ranks`` applies and the
forecast (:mod:`tilecast.loop.ranks_forecast`) models: the progress thread
runs worker 0 when the ranks' workers and progress threads together would
outnumber the cores. :func:`main_thread_first` is its rule for the main
thread while it submits (the forecast takes its part of the core from
``calibrate --ranks``'s probe, ``Network.submit_share``).
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

#: polling rounds between two calls of the worker's driver, tasks per call (StarPU-MPI's variables)
DRIVER_CALL_FREQUENCY = 1
DRIVER_TASK_FREQUENCY = 1


def progress_drives_worker(ranks_here: int, workers: int, cores: int | None) -> bool:
    """Does each rank's progress thread run its worker 0 (``ranks_here`` ranks of ``workers`` workers on
    ``cores`` cores; False when the core count is unknown)?"""
    return bool(cores) and ranks_here * (workers + 1) > cores


def runnable_threads(workers: int, drives: bool) -> int:
    """Threads one rank keeps runnable through a step once it has submitted it (workers spin, the
    progress thread polls; one fewer when it runs worker 0)."""
    return workers if drives else workers + 1


def set_mpi_threads(workers: int, ranks_here: int, cores: int | None = None) -> bool:
    """Set StarPU-MPI's variables for :func:`progress_drives_worker` in this process's environment (before
    StarPU starts); returns whether the progress thread runs worker 0."""
    cores = os.cpu_count() if cores is None else cores
    drives = progress_drives_worker(ranks_here, workers, cores)
    if drives:
        os.environ["STARPU_MPI_DRIVER_CALL_FREQUENCY"] = str(DRIVER_CALL_FREQUENCY)
        os.environ["STARPU_MPI_DRIVER_TASK_FREQUENCY"] = str(DRIVER_TASK_FREQUENCY)
    else:
        os.environ.pop("STARPU_MPI_DRIVER_CALL_FREQUENCY", None)
        os.environ.pop("STARPU_MPI_DRIVER_TASK_FREQUENCY", None)
    return drives


#: how much lower than its main thread a rank's other threads run where it has cores of its own (Linux nice
#: levels): at 10 the scheduler weighs a thread 110 against the main thread's 1024 (``sched_prio_to_weight``,
#: ``kernel/sched/core.c``), so the main thread gets about 90% of the core it shares with its worker while it
#: submits, and the worker all of it once the main thread sleeps in ``starpu_task_wait_for_all``
HELPER_NICE = 10


def main_thread_first(core: int | None, nice: int = HELPER_NICE) -> dict:
    """Let this rank's main thread (the caller) submit before its own threads take the cores: pin it to ``core``
    (its first worker's, an index among the cores this process may use; None, or one out of range, leaves it
    where it is) and put every other thread of the process ``nice`` levels below it (workers that spin,
    StarPU-MPI's progress thread that polls, Open MPI's helpers). Without it the main thread of each rank shares
    the cores with four runnable threads at equal weight and its submission is cut by their turns, at random.
    Threads started later inherit their starter's level. Returns ``{"core": the index pinned to or None,
    "lowered": threads at that level or lower, "nice": the level}``; a thread that ends or refuses is skipped, and
    lowering needs no privilege."""
    me = threading.get_native_id()
    if core is not None:  # StarPU numbers the cores this process may use, as hwloc lists them: the same here
        allowed = sorted(os.sched_getaffinity(0))
        try:
            os.sched_setaffinity(0, {allowed[core]})  # 0: the calling thread, on Linux
        except (IndexError, OSError):
            core = None
    base = os.getpriority(os.PRIO_PROCESS, me)
    level = min(base + nice, 19)
    lowered = 0
    for tid in thread_times():
        if tid == me:
            continue
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < level:
                os.setpriority(os.PRIO_PROCESS, tid, level)
            lowered += 1
        except OSError:
            continue
    return {"core": core, "lowered": lowered, "nice": level}


def runnable_others(samples: int = 20, every_s: float = 0.05) -> float:
    """Threads of other work runnable on this machine now: ``procs_running`` of /proc/stat less the one
    reading it, the median of ``samples`` readings ``every_s`` apart (0 where /proc/stat is unreadable).
    The forecast's ``background`` (:class:`tilecast.simulator.ranks_threads.CoreSharing`)."""
    got = []
    for i in range(samples):
        try:
            with open("/proc/stat") as f:
                got += [int(ln.split()[1]) - 1 for ln in f if ln.startswith("procs_running")]
        except (OSError, ValueError, IndexError):
            return 0.0
        if i + 1 < samples:
            time.sleep(every_s)
    return float(max(np.median(got), 0.0)) if got else 0.0


def thread_times() -> dict:
    """This process's threads now: ``{tid: (name, seconds on a core, seconds runnable but waiting for one)}``, from
    ``/proc/self/task/<tid>/schedstat`` (the scheduler's own nanosecond counts, ``kernel/sched/stats.h``;
    ``/proc/<tid>/stat``'s utime is in 10 ms ticks, too coarse for a step of tens of ms). Empty where unreadable."""
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run_ns, wait_ns = (int(x) for x in f.read().split()[:2])
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except (OSError, ValueError):
            continue
        out[int(tid)] = (name, run_ns * 1e-9, wait_ns * 1e-9)
    return out


def thread_deltas(before: dict, after: dict) -> dict:
    """Per thread alive at ``after``: (name, seconds on a core, seconds waiting for one) between two
    :func:`thread_times` readings (a thread started between them counts from 0)."""
    return {tid: (name, run - before.get(tid, (name, 0.0, 0.0))[1], wait - before.get(tid, (name, 0.0, 0.0))[2])
            for tid, (name, run, wait) in after.items()}


def thread_groups(threads: list, skip_first: bool = True) -> list:
    """Per rank of a run's ``MPIRunResult.threads``: ``{group: [s on a core, s waiting for one]}``, medians over the
    steps (after the first with ``skip_first``), by group: ``main`` (the thread that submits), ``worker`` (the
    threads StarPU names ``CPU <i>``: the workers, and the progress thread once it runs worker 0, as the CPU
    driver's initialisation names it) and ``other`` (Open MPI's and StarPU's helper threads, the allocator's)."""
    out = []
    for th in threads:
        run, wait = np.asarray(th["run_s"]), np.asarray(th["wait_s"])
        if skip_first and len(run) > 1:
            run, wait = run[1:], wait[1:]
        names = ["main" if n == "main" else "worker" if n.startswith("CPU ") else "other" for n in th["name"]]
        g = {}
        for k in ("main", "worker", "other"):
            cols = [i for i, n in enumerate(names) if n == k]
            g[k] = [float(np.median(run[:, cols].sum(axis=1))) if cols else 0.0,
                    float(np.median(wait[:, cols].sum(axis=1))) if cols else 0.0]
        out.append(g)
    return out


def submit_share_of(results) -> float | None:
    """The main thread's part of its rank's CPU while it submits: over runs (``MPIRunResult``), ranks and steps
    after the first, the median of the main thread's seconds on a core over its own and the rank's worker
    threads' (``CPU <i>``, the progress thread among them where it runs worker 0) from the barrier's exit to
    the submission's end. None when no run read its threads or none of them ran."""
    got = []
    for r in results:
        for th in r.threads or []:
            sub = th.get("submit")
            if not sub:
                continue
            run = np.asarray(sub["run_s"])
            run = run[1:] if len(run) > 1 else run
            main = [i for i, n in enumerate(sub["name"]) if n == "main"]
            work = [i for i, n in enumerate(sub["name"]) if n.startswith("CPU ")]
            if not main or not work:
                continue
            m, w = run[:, main].sum(axis=1), run[:, work].sum(axis=1)
            ok = (m + w) > 0
            got += (m[ok] / (m + w)[ok]).tolist()
    share = float(np.median(got)) if got else None
    return share if share is not None and 0.0 < share < 1.0 else None
