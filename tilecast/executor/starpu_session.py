"""A StarPU session: start the runtime with a scheduler and CPU workers, stop it on every exit path.

Only one session can be open in a process (StarPU is process-global). StarPU
stays paused whenever it is not executing a graph, because the Debian build's
idle workers spin at 100% CPU. StarPU's files (bus calibration, the
history-based performance models named after the kernels, used by the dm/dmda
schedulers) live under ``$TILECAST_HOME/starpu`` instead of ``~/.starpu``.

>>> with StarPUSession("dmda", workers=2) as s:      # doctest: +SKIP
...     trace = s.execute(graph, store)
"""

from __future__ import annotations

import atexit
import os

import numpy as np

from tilecast.kernels import all_kernels
from tilecast.kernels.native import kernel_addresses
from tilecast.home import home
from tilecast.executor.starpu_native import glue
from tilecast.errors import FieldError


class StarPUError(RuntimeError):
    """StarPU could not start or run (one line, with StarPU's error code)."""


# Policies the installed StarPU lists but that cannot be used reliably, and why.
WITHHELD = {
    # Seen with StarPU 1.3.10 (Debian bookworm): from an empty STARPU_HOME (performance models
    # without history) the first graph never finishes; it runs once other policies have filled
    # the history. Withheld rather than let a run hang.
    "modular-heteroprio-heft": "hangs in StarPU 1.3.10 while its performance models have no history",
}


def policies() -> dict[str, str]:
    """Scheduling policies the installed StarPU offers and tilecast runs: name -> description."""
    g = glue()
    names = g.ffi.new("const char *[256]")
    descs = g.ffi.new("const char *[256]")
    n = min(g.lib.tcs_policies(names, descs, 256), 256)
    offered = {g.ffi.string(names[i]).decode(): g.ffi.string(descs[i]).decode() for i in range(n)}
    return {k: v for k, v in offered.items() if k not in WITHHELD}


def max_workers() -> int:
    """The most CPU workers this StarPU build supports (STARPU_MAXCPUS)."""
    return int(glue().lib.tcs_max_cpus())


def default_workers() -> int:
    return max(1, min(os.cpu_count() or 1, max_workers()))


def starpu_home():
    return home("starpu")


_ACTIVE: list = []


class StarPUSession:
    """StarPU running with policy ``sched`` on ``workers`` CPU workers (a context manager)."""

    def __init__(self, sched: str = "dmda", workers: int | None = None, memory=None):
        offered = policies()
        if sched in WITHHELD:
            raise FieldError(f"sched: scheduler {sched!r} is not available: {WITHHELD[sched]}")
        if sched not in offered:
            raise FieldError(f"sched: unknown scheduler {sched!r}; this StarPU offers: {', '.join(sorted(offered))}")
        limit = max_workers()
        workers = default_workers() if workers is None else int(workers)
        if not 1 <= workers <= limit:
            raise FieldError(f"workers must be between 1 and {limit} (this StarPU's limit), got {workers}")
        self.sched = sched
        self.n_cpus = workers
        self.memory = memory  # a MemoryLimit (tilecast.executor.memory_limit), or None: no limit
        self.disk_node = -1  # StarPU's disk memory node, once started with an offload directory
        self.managed_stores: list = []  # ManagedTileStores registered on this session, closed before shutdown
        self._open = False
        self.tasks_done_at = 0.0  # perf_counter() when the last executed graph's tasks were all done
        self.last_makespan_s = 0.0  # that graph's makespan (its tasks' traced times, untraced steps too)
        self.last_submit_s = 0.0  # and how long its submission took
        self.last_marks = {}  # that graph's timeline (starpu_execute.step_marks)

    # --- lifetime ----------------------------------------------------------
    def start(self) -> "StarPUSession":
        if self._open:
            return self
        if _ACTIVE:
            raise StarPUError("a StarPU session is already open in this process; close it first")
        g = glue()
        home = starpu_home()
        home.mkdir(parents=True, exist_ok=True)
        os.environ["STARPU_HOME"] = str(home)
        os.environ.setdefault("STARPU_SILENT", "1")
        addresses = kernel_addresses()  # builds the kernels extension first, sets one BLAS thread
        with limit_environment(self.memory, self.n_cpus), priority_environment(self.sched):
            ret = g.lib.tcs_start(self.sched.encode(), self.n_cpus)
        if ret != 0:
            raise StarPUError(f"StarPU failed to start (sched={self.sched}, workers={self.n_cpus}): "
                              f"{os.strerror(-ret) if ret < 0 else ret}")
        self._open = True
        _ACTIVE.append(self)
        from tilecast.executor.starpu_execute import TileHandles

        self.tile_handles = TileHandles()
        try:
            kernels = all_kernels()
            names = [g.ffi.new("char[]", k.name.encode()) for k in kernels]
            ret = g.lib.tcs_set_kernels(
                len(kernels), g.ffi.from_buffer("uint64_t[]", addresses), g.ffi.new("const char *[]", names),
                g.ffi.new("int[]", [len(k.buffers) for k in kernels]))
            if ret != 0:
                raise StarPUError(f"setting up StarPU codelets failed: {os.strerror(-ret)}")
            if self.memory is not None and self.memory.offload_dir is not None:
                self._register_disk()
            lo, hi = g.ffi.new("int *"), g.ffi.new("int *")
            g.lib.tcs_priority_range(lo, hi)
            self.priority_range = (int(lo[0]), int(hi[0]))  # what the running policy declares
            self.priority_cache = None  # (graph, n_tasks, priorities) of the last graph executed
            n = g.lib.tcs_nworkers()
            self.worker_nodes = np.array([g.lib.tcs_worker_node(w) for w in range(n)], dtype=np.int64)
            buf = g.ffi.new("char[128]")
            self.worker_names = []
            for w in range(n):
                g.lib.tcs_worker_name(w, buf, 128)
                self.worker_names.append(g.ffi.string(buf).decode())
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Shut StarPU down (writes its performance models); safe to call twice."""
        if not self._open:
            return
        try:
            for store in list(self.managed_stores):
                store.close()
            self.tile_handles.release()
        finally:
            glue().lib.tcs_stop()
        self._open = False
        if self in _ACTIVE:
            _ACTIVE.remove(self)

    def _register_disk(self) -> None:
        g = glue()
        size = self.memory.disk_size_bytes()
        self._disk_dir = g.ffi.new("char[]", os.path.abspath(self.memory.offload_dir).encode())
        direct = self.memory.offload_io == "direct"
        if direct:
            from tilecast.executor.memory_limit import check_direct_io

            check_direct_io(self.memory.offload_dir)
        node = g.lib.tcs_disk_register(self._disk_dir, size, int(direct))
        if node < 0:
            raise StarPUError(f"StarPU could not use {self.memory.offload_dir} as a disk memory node")
        self.disk_node = int(node)
        self.disk_traffic()  # start the counters from zero

    def disk_traffic(self) -> tuple[int, int]:
        """(bytes written to, bytes read from) the disk node since the last call (StarPU's bus
        profiling; 0, 0 without a disk node)."""
        t = self.disk_transfers()
        return t["written_bytes"], t["read_bytes"]

    def disk_transfers(self) -> dict:
        """The disk node's traffic since the last call (or :meth:`disk_traffic`): ``written_bytes``,
        ``read_bytes`` (bytes main memory -> disk node, and back) and ``writes``, ``reads`` (those
        transfers, one per tile), from StarPU's bus profiling counters, which reading resets
        (StarPU 1.3.10, ``starpu_bus_get_profiling_info``); all 0 without a disk node."""
        out = {"written_bytes": 0, "read_bytes": 0, "writes": 0, "reads": 0}
        if self.disk_node < 0:
            return out
        g = glue()
        b, c = g.ffi.new("int64_t *"), g.ffi.new("int64_t *")
        g.lib.tcs_bus_bytes(0, self.disk_node, b, c)
        out["written_bytes"], out["writes"] = int(b[0]), int(c[0])
        g.lib.tcs_bus_bytes(self.disk_node, 0, b, c)
        out["read_bytes"], out["reads"] = int(b[0]), int(c[0])
        return out

    def __enter__(self) -> "StarPUSession":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def is_open(self) -> bool:
        return self._open

    @property
    def n_workers(self) -> int:
        return len(self.worker_nodes) if self._open else 0

    def _require_open(self) -> None:
        if not self._open:
            raise StarPUError("the StarPU session is not started (use it as a context manager)")

    # --- execution ---------------------------------------------------------
    def execute(self, graph, store, dry: bool = False, submit_paused: bool = False, trace: bool = True,
                priority=None):
        """Run ``graph`` on the tiles of ``store`` in place; return the per-task trace (source 'real').

        With ``trace=False`` the trace table is not built (None is returned); it
        costs about a microsecond per task in pandas.
        ``dry`` submits empty codelets (no kernels, no performance-model updates),
        to measure the runtime's and tilecast's own per-task cost.
        ``submit_paused`` submits the whole graph before the workers start
        (no overlap of submission and execution, but the submitting thread does
        not compete with spinning idle workers for the cores).
        ``priority``: per-task weights whose bottom levels become the tasks' priorities under the
        policies that use them (default: the local machine's modelled durations; see
        :func:`tilecast.executor.starpu_execute.graph_priorities`).
        """
        from tilecast.executor.starpu_execute import execute_graph

        self._require_open()
        return execute_graph(self, graph, store, dry=dry, submit_paused=submit_paused, trace=trace,
                             priority=priority)

    def baseline(self, graph, store, profiling: bool = False) -> float:
        """Seconds StarPU alone takes for the graph's tasks as empty codelets (no callbacks; StarPU's
        per-task profiling off, or on as tilecast runs it)."""
        from tilecast.executor.starpu_execute import baseline_graph

        self._require_open()
        return baseline_graph(self, graph, store, profiling)


# Submission throttle under a memory limit (StarPU 1.3.10, src/core/task.c: starpu_task_submit blocks once
# MAX tasks are submitted and not finished, until MIN remain): tasks queued far ahead would have StarPU
# prefetch, and hold in main memory, tiles that later tasks need room for.
THROTTLE_PER_WORKER = (16, 8)


class environment:
    """Variables set in ``os.environ`` while inside (StarPU reads its own when it starts), restored on leaving."""

    def __init__(self, env: dict):
        self.env = dict(env)

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        return self

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class limit_environment(environment):
    """StarPU's environment for a memory limit, set while StarPU starts (it reads it then) and restored."""

    def __init__(self, memory, workers: int):
        from tilecast.executor.memory_limit import limit_prefetches

        env = {}
        if memory is not None:
            hi, lo = THROTTLE_PER_WORKER
            env = {"STARPU_LIMIT_CPU_MEM": str(memory.limit_mib),
                   "STARPU_LIMIT_MAX_SUBMITTED_TASKS": str(hi * workers),
                   "STARPU_LIMIT_MIN_SUBMITTED_TASKS": str(lo * workers),
                   "STARPU_PREFETCH": "1" if limit_prefetches() else "0"}
        super().__init__(env)

    def __enter__(self):
        super().__enter__()
        if self.env:  # tiles freed by StarPU go back to the system (docs/memory.md)
            from tilecast.executor.memory_limit import map_tile_buffers

            map_tile_buffers()
        return self


class priority_environment(environment):
    """The priority range tilecast declares for ``sched`` (:func:`tilecast.graph.priorities.declared_range`:
    dmdasd's decisions then read one sum per worker instead of every queued task), set while StarPU starts
    and restored; nothing for the other policies."""

    def __init__(self, sched: str):
        from tilecast.graph.priorities import declared_range

        span = declared_range(sched)
        super().__init__({} if span is None else {"STARPU_MIN_PRIO": str(span[0]), "STARPU_MAX_PRIO": str(span[1])})


@atexit.register
def _close_at_exit() -> None:
    for s in list(_ACTIVE):
        s.close()


def disk_files() -> dict:
    """The disk node's files created in this process so far by ``offload_io="direct"`` sessions (StarPU makes
    one per tile it evicts): ``direct`` (opened with O_DIRECT) and ``buffered`` (tiles not of whole pages)."""
    g = glue()
    d, b = g.ffi.new("int64_t *"), g.ffi.new("int64_t *")
    g.lib.tcs_disk_files(d, b)
    return {"direct": int(d[0]), "buffered": int(b[0])}
