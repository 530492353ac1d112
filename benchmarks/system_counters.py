"""What the machine did during each step of a memory-limited run: the offload device's bytes and busy time, the
processors' split, the process's own processor time, and Linux's dirty bytes against its thresholds.

The forecast (docs/memory.md) puts each step's disk traffic on the device and the page cache in front of it, and
StarPU's and the kernels' time on the workers; these counters say what the machine itself saw, step by step:

- ``/proc/diskstats`` for the device holding the offload directory: bytes written and read, and the fraction of
  the step it had a request in flight (``io_ticks``): a step bound by the device has it near 1;
- ``/proc/stat``: the machine's processor time split into user, system, idle, I/O wait and, in a virtual
  machine, steal (time the hypervisor ran other guests instead; all processes: on a shared machine, others' too);
- ``/proc/self/stat``: this process's user and system seconds (its workers, StarPU's threads, the ``pwrite`` and
  ``pread`` copies through the page cache; not the kernel's flusher threads) and its minor page faults (pages
  touched for the first time since they were mapped);
- ``/proc/self/task/*/schedstat``: the StarPU workers' own threads (named ``CPU 0``, ``CPU 1``, ...) apart from
  the rest, their time on a core and their time runnable but waiting for one. glibc's POSIX AIO helper threads,
  which run the unistd disk backend's ``pread``/``pwrite``, take the name of the worker that created them but
  live about a second each: a worker's own thread is one of that name alive at both ends of the step
  (docs/memory.md, "Whose threads take the processors");
- ``/proc/vmstat``: pages the kernel reclaimed (``pgsteal_kswapd``, ``pgsteal_direct``), i.e. bytes the full page
  cache gave up for the step's reads and writes;
- ``/proc/meminfo`` sampled every ``interval`` seconds by a thread: the largest ``Dirty + Writeback`` and the
  share of samples at 90% of the background threshold or more (the flusher writing back; Linux holds a paced
  writer's dirty bytes near there: docs/memory.md, "``calibrate`` measures the write-back pace").

    counters = StepCounters(offload_dir); counters.start()
    ... at the end of each step: counters.mark()
    counters.stop(); counters.steps()  # one dict per step
"""

from __future__ import annotations

import os
import threading
import time

from tilecast.executor.mpi_threads import thread_times


def device_of(path: str) -> str | None:
    """The name ``/proc/diskstats`` gives the block device holding ``path`` (None where there is none)."""
    st = os.stat(path)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    with open("/proc/diskstats") as f:
        for line in f:
            p = line.split()
            if int(p[0]) == major and int(p[1]) == minor:
                return p[2]
    return None


def _disk(name: str | None) -> tuple[int, int, int]:
    """(bytes read, bytes written, ms with a request in flight) of ``name`` so far."""
    if name is None:
        return 0, 0, 0
    with open("/proc/diskstats") as f:
        for line in f:
            p = line.split()
            if p[2] == name:
                return int(p[5]) * 512, int(p[9]) * 512, int(p[12])
    return 0, 0, 0


def _cpu() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def _self_cpu() -> tuple[float, float, int]:
    """(user seconds, system seconds, minor page faults) of this process."""
    with open("/proc/self/stat") as f:
        p = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(p[11]) / tick, int(p[12]) / tick, int(p[7])


def _worker_threads() -> dict[int, tuple[float, float]]:
    """{thread id: (seconds on a core, seconds runnable but waiting for one)} of this process's threads named as
    StarPU's CPU workers (:func:`tilecast.executor.mpi_threads.thread_times`: the scheduler's own counts)."""
    return {tid: (run, wait) for tid, (name, run, wait) in thread_times().items() if name.startswith("CPU ")}


def _reclaimed_pages() -> int:
    out = 0
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                k, v = line.split()
                if k in ("pgsteal_kswapd", "pgsteal_direct"):
                    out += int(v)
    except (OSError, ValueError):
        pass
    return out


def _dirty() -> int:
    out = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(("Dirty:", "Writeback:")):
                out += int(line.split()[1]) * 1024
    return out


class StepCounters:
    """The counters of the module's docstring between successive :meth:`mark` calls; ``background_bytes``: the
    ``dirty_background_ratio`` threshold (bytes: :func:`tilecast.perfmodel.page_cache.page_cache_for`), 0 where
    unknown."""

    def __init__(self, directory: str, background_bytes: float = 0.0, interval: float = 0.2):
        self.device = device_of(directory)
        self.background, self.interval = float(background_bytes), interval
        self.marks, self.samples = [], []
        self._stop = threading.Event()

    def _snapshot(self):
        return time.perf_counter(), _disk(self.device), _cpu(), _self_cpu(), _worker_threads(), _reclaimed_pages()

    def _sample(self):
        while not self._stop.wait(self.interval):
            self.samples.append((time.perf_counter(), _dirty()))

    def start(self) -> None:
        self.marks = [self._snapshot()]
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def mark(self) -> None:
        self.marks.append(self._snapshot())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def steps(self) -> list[dict]:
        """One dict per interval between marks (the first: from :meth:`start`)."""
        out = []
        tick = os.sysconf("SC_CLK_TCK")
        page = os.sysconf("SC_PAGE_SIZE")
        for (t0, d0, c0, s0, w0, r0), (t1, d1, c1, s1, w1, r1) in zip(self.marks, self.marks[1:]):
            dt = t1 - t0
            cpu = [b - a for a, b in zip(c0, c1)]
            total = sum(cpu[:8]) or 1
            # all processors, all processes; not the time the hypervisor gave to other guests (steal)
            busy_s = (sum(cpu[:8]) - cpu[3] - cpu[4] - cpu[7]) / tick
            process_s = (s1[0] - s0[0]) + (s1[1] - s0[1])
            workers_s = sum(w1[t][0] - w0[t][0] for t in w1 if t in w0)
            workers_waiting_s = sum(w1[t][1] - w0[t][1] for t in w1 if t in w0)
            dirty = [d for t, d in self.samples if t0 <= t <= t1]
            out.append({
                "seconds": dt, "device": self.device,
                "device_written_bytes": d1[1] - d0[1], "device_read_bytes": d1[0] - d0[0],
                "device_busy": (d1[2] - d0[2]) / 1e3 / dt if dt > 0 else 0.0,
                "cpu_user": (cpu[0] + cpu[1]) / total, "cpu_system": (cpu[2] + cpu[5] + cpu[6]) / total,
                "cpu_idle": cpu[3] / total, "cpu_iowait": cpu[4] / total, "cpu_steal": cpu[7] / total,
                "process_user_s": s1[0] - s0[0], "process_system_s": s1[1] - s0[1],
                # pages first touched (a tile's fresh mapping, filled by a read back or a kernel's output)
                "process_minor_faults": s1[2] - s0[2],
                # the workers' own threads; the process's other threads (AIO helpers, StarPU's, Python's); the
                # processors' busy time outside the process (kswapd, the flusher, other processes)
                "workers_cpu_s": workers_s, "process_other_cpu_s": process_s - workers_s,
                "workers_waiting_for_a_core_s": workers_waiting_s,
                "outside_process_cpu_s": busy_s - process_s,
                "reclaimed_bytes": (r1 - r0) * page,
                "dirty_max_bytes": max(dirty, default=0),
                "dirty_over_background_share": (sum(d >= 0.9 * self.background for d in dirty) / len(dirty)
                                                if dirty and self.background > 0 else None)})
        return out
