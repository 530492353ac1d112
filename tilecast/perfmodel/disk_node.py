"""The disk memory node of a memory-limited run: its measured speed, stored with the calibration.

Under ``--memory-limit`` with ``--offload-dir`` StarPU writes tiles evicted
from main memory to a disk node with its unistd backend and reads them back
(StarPU 1.3.10, ``src/core/disk_ops/unistd/disk_unistd_global.c``): a tile's
first write-back creates one file for it (``starpu_unistd_global_alloc``:
``_starpu_mktemp_many`` then ``ftruncate`` to the tile's size), and every
transfer is one ``pwrite`` or ``pread`` of the whole tile at offset 0
(``starpu_unistd_global_write``/``_read``, or their aio forms), with no
``fsync``: the kernel's page cache takes the writes. (StarPU calls ``fsync``
only in its own bandwidth probe, ``_starpu_get_unistd_global_bandwidth_between_disk_and_main_ram``,
not on the data path.)

:func:`measure_disk` times that path in the offload directory with blocks of
two tile-like sizes: one file per block, created and truncated first (StarPU
makes a tile's file once and reuses it for its later write-backs), written with
``os.pwrite``, then read back with ``os.pread``; a line
through (bytes, seconds) per direction gives a latency (the per-transfer cost:
the system calls, the file's creation) and a bandwidth. :class:`DiskNode` holds
the figures; :func:`save_disk`/:func:`stored_disk` keep them beside the
kernel calibration (``$TILECAST_HOME/calibration/<machine>-<fingerprint>.disk.json``).

Those few MiB stay in the kernel's page cache, so the figures are the cache's.
:func:`measure_device` times the same transfers with ``O_DIRECT``, which
bypasses the cache: the device's own bandwidth, which a step whose traffic
outgrows the cache meets (:mod:`tilecast.perfmodel.page_cache`).
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from tilecast.atomic_file import atomic_write
from tilecast.home import home

DISK_FORMAT = 1
#: block sizes timed: a 64 x 64 and a 256 x 256 float32 tile
BLOCKS = (16 << 10, 256 << 10)


class DiskNodeError(ValueError):
    """A disk-node measurement or file that cannot be used; one line naming the field."""


@dataclass(frozen=True)
class DiskNode:
    """Seconds per transfer = latency + bytes / bandwidth, each way (host -> disk is a write)."""

    write_bandwidth: float  # bytes/s
    read_bandwidth: float  # bytes/s
    write_latency: float  # s per transfer
    read_latency: float  # s per transfer
    directory: str = ""
    source: str = ""
    measured_at: str = ""
    #: StarPU's own cost per disk transfer (s), beyond the file system's: fitted on a memory-limited run
    #: (benchmarks/memory_forecast.py --fit-first); 0 until then
    runtime_latency: float = 0.0
    runtime_source: str = ""
    #: StarPU's time per disk transfer and per tile held in main memory (s): its walks of the node's list of
    #: tiles (memalloc.c, mc_list, under mc_lock) grow with the tiles the limit holds; fitted with
    #: runtime_latency (benchmarks/memory_forecast.py --fit); 0 until then
    walk_s: float = 0.0
    #: StarPU's time per tile its search for a tile to reuse walks past (s; memalloc.c,
    #: try_to_reuse_potentially_in_use_mc), charged to the allocating worker on the simulated walks; timed by
    #: ``tilecast calibrate --offload-dir`` on StarPU alone (tilecast.loop.walk_probe); 0 until then
    walk_tile_s: float = 0.0
    walk_tile_source: str = ""
    #: StarPU's time in a task's worker before the task starts, under the limit (s): ``per_task`` and per event
    #: of the task's acquisition (``allocs``, ``reads``, ``writebacks``, ``drops``: tiles; ``read_bytes``,
    #: ``writeback_bytes``: bytes), fitted by ``tilecast calibrate`` on probe steps (tilecast.loop.disk_fit);
    #: empty until then. Where set, it replaces runtime_latency (0 then).
    worker_costs: dict = field(default_factory=dict)
    worker_costs_source: str = ""
    #: ``worker_costs`` fitted per worker count (``{"1": {...}, "2": {...}}``) where ``tilecast calibrate`` ran
    #: its probes on more than one; the forecast takes its own count's (:meth:`costs_for`). A tile read back
    #: waits for glibc's AIO helper to get a core: with one worker on two cores it has one, with two it waits
    #: behind the polling workers (docs/memory.md, 2026-12-02). Empty: ``worker_costs`` for every count.
    worker_costs_by_workers: dict = field(default_factory=dict)
    #: ``worker_costs`` fitted per worker count on a probe of one tile size (``{"tile_bytes": N, "by_workers":
    #: {"1": {...}, ...}, "source": "..."}``), run by ``tilecast calibrate`` at the tiles of the configuration it
    #: calibrates where they are much larger than the standard probes': a read back of a 256 KiB tile cost a
    #: worker alone 149 us where the 4-16 KiB probes gave 18-58 us (docs/memory.md). The forecast of a step whose
    #: tiles are within a factor of two of ``tile_bytes`` takes these (:meth:`costs_for`). Empty: none.
    tile_costs: dict = field(default_factory=dict)
    #: the device under the page cache (O_DIRECT: :func:`measure_device`), bytes/s and s per transfer; 0 where
    #: not measured (the forecast then charges the figures above, the page cache's, for every transfer)
    device_write_bandwidth: float = 0.0
    device_read_bandwidth: float = 0.0
    device_read_latency: float = 0.0
    device_source: str = ""
    #: the rate the device takes the page cache's write-back at: tiles' dirty pages written back by ``fsync``
    #: (bytes/s; :mod:`tilecast.perfmodel.io_cpu`, run by ``tilecast calibrate --offload-dir``), the forecast's
    #: flusher rate; 0 where not measured (the flusher is then taken to write at ``device_write_bandwidth``). Homes
    #: calibrated before it may hold here the pace of a paced stream (:mod:`tilecast.perfmodel.writeback_pace`),
    #: which on the AMD EPYC guest measured the hypervisor's first touch of fresh pages (docs/memory.md)
    device_writeback_bandwidth: float = 0.0
    device_writeback_source: str = ""
    #: seconds of computing the disk traffic takes from workers that fill the cores: per byte written through the
    #: page cache (``io_cpu_write``: the copy and the write-back), per second of reading from the device through it
    #: (``io_cpu_read``) and per byte read from it (``io_cpu_hit``), measured beside ``io_cpu_busy`` computing threads
    #: (:mod:`tilecast.perfmodel.io_cpu`, run by ``tilecast calibrate --offload-dir``); 0 where not measured
    io_cpu_write: float = 0.0
    io_cpu_read: float = 0.0
    io_cpu_hit: float = 0.0
    io_cpu_busy: int = 0
    io_cpu_source: str = ""
    #: StarPU's costs in the workers fitted on the probes run with ``--offload-io direct`` (``tilecast calibrate
    #: --offload-dir DIR --offload-io direct``): ``worker_costs``, ``worker_costs_by_workers``, ``tile_costs`` as
    #: above, and their ``source``; :meth:`direct` takes them. Empty: not fitted (the buffered probes' are taken).
    direct_costs: dict = field(default_factory=dict)

    def direct(self) -> "DiskNode":
        """The node as ``--offload-io direct`` uses it (O_DIRECT, ``executor/c/disk_ops.c``): every transfer at
        the device's O_DIRECT figures, no page cache in front of it and none of the page cache's computing time
        (its copies, reclaim and write-back). StarPU's costs in the workers: those fitted on probes run direct
        (:attr:`direct_costs`) where ``calibrate --offload-io direct`` fitted them, else the buffered probes'. The
        write latency is taken as the device's read latency (the only one measured). Where the device was not
        measured, a :class:`DiskNodeError` naming ``offload_io`` (``tilecast calibrate --offload-dir`` measures it)."""
        if not self.has_device:
            raise DiskNodeError(f"offload_io: the device under {self.directory or 'the offload directory'} was not "
                                "measured (tilecast calibrate --offload-dir DIR measures it); direct transfers go to it")
        costs = {}
        fitted = self.direct_costs
        if fitted.get("worker_costs"):
            costs = {"worker_costs": dict(fitted["worker_costs"]),
                     "worker_costs_by_workers": dict(fitted.get("worker_costs_by_workers", {})),
                     "tile_costs": dict(fitted.get("tile_costs", {})), "worker_costs_source": fitted.get("source", "")}
        return replace(self, write_bandwidth=self.device_write_bandwidth, read_bandwidth=self.device_read_bandwidth,
                       write_latency=self.device_read_latency, read_latency=self.device_read_latency,
                       source=f"{self.device_source}; O_DIRECT: no page cache",
                       device_write_bandwidth=0.0, device_read_bandwidth=0.0, device_writeback_bandwidth=0.0,
                       io_cpu_write=0.0, io_cpu_read=0.0, io_cpu_hit=0.0, io_cpu_busy=0, io_cpu_source="",
                       direct_costs={}, **costs)

    @property
    def has_device(self) -> bool:
        """Whether the device's own speed was measured (the forecast then puts the page cache in front of it:
        :mod:`tilecast.perfmodel.page_cache`)."""
        return self.device_write_bandwidth > 0 and self.device_read_bandwidth > 0

    def costs_for(self, workers: int, tile_bytes: float | None = None) -> dict:
        """StarPU's costs in the worker for a step on ``workers`` workers whose typical tile (:func:`typical_tile_bytes`)
        holds ``tile_bytes``: those fitted on a probe of tiles within a factor of two of it on that many workers
        (``tile_costs``), else those fitted on the standard probes on that many, else ``worker_costs``."""
        at_tile = self.tile_costs.get("by_workers", {}).get(str(int(workers)))
        if at_tile and tile_bytes and 0.5 <= tile_bytes / self.tile_costs["tile_bytes"] <= 2.0:
            return at_tile
        return self.worker_costs_by_workers.get(str(int(workers))) or self.worker_costs

    @property
    def flusher_bandwidth(self) -> float:
        """Bytes/s the flusher writes dirty pages back at: the measured write-back rate, else the device's
        O_DIRECT write bandwidth."""
        return self.device_writeback_bandwidth or self.device_write_bandwidth

    def write_s(self, nbytes: float) -> float:
        return self.runtime_latency + self.write_latency + nbytes / self.write_bandwidth

    def read_s(self, nbytes: float) -> float:
        return self.runtime_latency + self.read_latency + nbytes / self.read_bandwidth

    def describe(self) -> str:
        rt = f" + StarPU {self.runtime_latency * 1e6:.0f} us" if self.runtime_latency else ""
        walk = f" + {self.walk_s * 1e9:.0f} ns x tiles in memory" if self.walk_s else ""
        line = (f"write {self.write_bandwidth / 1e9:.2f} GB/s + {self.write_latency * 1e6:.0f} us, read "
                f"{self.read_bandwidth / 1e9:.2f} GB/s + {self.read_latency * 1e6:.0f} us{rt} per transfer{walk}")
        if self.walk_tile_s:
            line += f"; StarPU's search for a tile to reuse {self.walk_tile_s * 1e9:.0f} ns per tile walked"
        if self.worker_costs:
            c = self.worker_costs
            line += "; StarPU in the worker: " + (_costs_text(c) or "nothing")
            for w, cw in sorted(self.worker_costs_by_workers.items()):
                if cw != c:
                    line += f" (on {w} worker{'s' if w != '1' else ''}: {_costs_text(cw)})"
        if self.tile_costs:
            kib = self.tile_costs["tile_bytes"] / 1024
            line += f"; at tiles of {kib:g} KiB: " + "; ".join(
                f"on {w} worker{'s' if w != '1' else ''}: {_costs_text(cw) or 'nothing'}"
                for w, cw in sorted(self.tile_costs.get("by_workers", {}).items()))
        if self.direct_costs.get("worker_costs"):
            line += "; with --offload-io direct: " + _costs_text(self.direct_costs["worker_costs"])
        if self.has_device:
            line += (f"; device (O_DIRECT) write {self.device_write_bandwidth / 1e9:.2f} GB/s, read "
                     f"{self.device_read_bandwidth / 1e9:.2f} GB/s + {self.device_read_latency * 1e6:.0f} us")
            if self.device_writeback_bandwidth:
                line += f", write-back {self.device_writeback_bandwidth / 1e9:.3f} GB/s"
        if self.io_cpu_busy:
            line += (f"; computing lost beside {self.io_cpu_busy} busy threads {self.io_cpu_write * 2**30:.2f} s per GiB "
                     f"written, {self.io_cpu_hit * 2**30:.2f} per GiB read from the cache, {self.io_cpu_read:.2f} per "
                     f"second reading from the device")
        return line


def typical_tile_bytes(tile_nbytes) -> int:
    """The tile size that half of a graph's bytes lie in tiles of at most (the byte-weighted median of
    ``tile_nbytes``): the size of the tiles a memory-limited step mostly moves, whatever its small ones."""
    b = np.sort(np.asarray(tile_nbytes, dtype=np.int64))
    if not len(b) or b[-1] <= 0:
        return 0
    c = np.cumsum(b)
    return int(b[np.searchsorted(c, c[-1] / 2)])


def _costs_text(c: dict) -> str:
    """StarPU's costs in the worker (``DiskNode.worker_costs``) in words: us per task and per tile event, per KiB."""
    names = {"per_task": "task", "allocs": "tile allocated", "reads": "tile read back",
             "writebacks": "tile written back", "drops": "tile evicted clean"}
    parts = [f"{c[k] * 1e6:.0f} us per {n}" for k, n in names.items() if c.get(k)]
    parts += [f"{c[k] * 1024 * 1e6:.2f} us per KiB {k.split('_')[0].replace('writeback', 'written back')}"
              for k in ("read_bytes", "writeback_bytes") if c.get(k)]
    return ", ".join(parts)


def _fit(sizes, seconds) -> tuple[float, float]:
    """(latency s, bandwidth bytes/s) of the line through per-transfer (bytes, seconds)."""
    slope, intercept = np.polyfit(np.asarray(sizes, float), np.asarray(seconds, float), 1)
    slope = max(float(slope), 1e-15)  # a page cache faster than the timer resolves: effectively unbounded
    return max(float(intercept), 0.0), 1.0 / slope


def measure_disk(directory: str, total_bytes: int = 32 << 20, repeats: int = 3, device: bool = True) -> DiskNode:
    """Time StarPU's unistd transfers in ``directory`` (see the module's docstring): about ``total_bytes``
    written and read per block size and repeat, the fastest repeat kept (the machine is shared); these few MiB
    stay in the page cache, so the figures are the cache's. With ``device``, also the device under it
    (:func:`measure_device`, twice the bytes)."""
    if not os.path.isdir(directory):
        raise DiskNodeError(f"offload_dir: no such directory {directory}")
    write_pts, read_pts = [], []
    for block in BLOCKS:
        n = max(int(total_bytes // block), 8)
        buf = os.urandom(block)
        best_w = best_r = float("inf")
        for _ in range(repeats):
            work = tempfile.mkdtemp(prefix=".tilecast-disk-", dir=directory)
            try:
                fds = []
                for i in range(n):  # a tile's file is made once, at its first write-back
                    fd, _ = tempfile.mkstemp(dir=work)
                    os.ftruncate(fd, block)
                    fds.append(fd)
                t0 = time.perf_counter()
                for fd in fds:
                    os.pwrite(fd, buf, 0)
                t1 = time.perf_counter()
                for fd in fds:
                    os.pread(fd, block, 0)
                t2 = time.perf_counter()
                for fd in fds:
                    os.close(fd)
            except OSError as e:
                raise DiskNodeError(f"offload_dir: cannot write in {directory} ({e.strerror or e})") from None
            finally:
                shutil.rmtree(work, ignore_errors=True)
            best_w, best_r = min(best_w, (t1 - t0) / n), min(best_r, (t2 - t1) / n)
        write_pts.append((block, best_w))
        read_pts.append((block, best_r))
    wl, wb = _fit(*zip(*write_pts))
    rl, rb = _fit(*zip(*read_pts))
    return DiskNode(wb, rb, wl, rl, os.path.abspath(directory),
                    f"measured: StarPU's unistd transfers (pwrite, pread of one file per tile; no fsync) with "
                    f"{'/'.join(f'{b >> 10} KiB' for b in BLOCKS)} blocks, best of {repeats}: the page cache",
                    datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    **(measure_device(directory, 2 * total_bytes, min(repeats, 2)) if device else {}))


#: block sizes timed on the device: a 128 x 128 and a 512 x 512 float32 tile (O_DIRECT needs whole blocks)
DEVICE_BLOCKS = (64 << 10, 1 << 20)


def measure_device(directory: str, total_bytes: int = 64 << 20, repeats: int = 2) -> dict:
    """The device under ``directory``'s page cache: the same transfers as :func:`measure_disk` (one file per
    block, one ``pwrite`` then one ``pread`` of it) opened with ``O_DIRECT``, so that they bypass the cache;
    about ``total_bytes`` per block size and repeat, the fastest repeat kept. Returns the DiskNode fields
    ``device_write_bandwidth``, ``device_read_bandwidth``, ``device_read_latency``, ``device_source``; zeros and
    the reason in ``device_source`` where the file system refuses O_DIRECT (tmpfs)."""
    import mmap

    if not hasattr(os, "O_DIRECT"):
        return {"device_source": "not measured: no O_DIRECT on this system"}
    write_pts, read_pts = [], []
    for block in DEVICE_BLOCKS:
        n = max(int(total_bytes // block), 4)
        buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
        buf.write(os.urandom(block))
        best_w = best_r = float("inf")
        for _ in range(repeats):
            work = tempfile.mkdtemp(prefix=".tilecast-device-", dir=directory)
            fds = []
            try:
                for i in range(n):
                    fds.append(os.open(os.path.join(work, str(i)), os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600))
                t0 = time.perf_counter()
                for fd in fds:
                    os.pwrite(fd, buf, 0)
                t1 = time.perf_counter()
                for fd in fds:
                    os.preadv(fd, [buf], 0)
                t2 = time.perf_counter()
            except OSError as e:
                return {"device_source": f"not measured: O_DIRECT transfers refused in {directory} "
                                         f"({e.strerror or e})"}
            finally:
                for fd in fds:
                    os.close(fd)
                shutil.rmtree(work, ignore_errors=True)
            best_w, best_r = min(best_w, (t1 - t0) / n), min(best_r, (t2 - t1) / n)
        write_pts.append((block, best_w))
        read_pts.append((block, best_r))
        buf.close()
    _, wb = _fit(*zip(*write_pts))
    rl, rb = _fit(*zip(*read_pts))
    return {"device_write_bandwidth": wb, "device_read_bandwidth": rb, "device_read_latency": rl,
            "device_source": (f"measured: O_DIRECT pwrite, pread of one file per block, "
                              f"{'/'.join(f'{b >> 10} KiB' for b in DEVICE_BLOCKS)} blocks, {total_bytes >> 20} MiB "
                              f"each, best of {repeats}")}


def disk_path(machine) -> str:
    return str(home("calibration", f"{machine.name}-{machine.fingerprint()}.disk.json"))


def save_disk(machine, disk: DiskNode) -> str:
    path = disk_path(machine)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with atomic_write(path, "w") as f:
        json.dump({"format": DISK_FORMAT, "machine": machine.name, "fingerprint": machine.fingerprint(),
                   **asdict(disk)}, f, indent=1)
    return path


def load_disk(path: str) -> DiskNode:
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise DiskNodeError(f"{path}: cannot read the disk node ({e})") from None
    if doc.get("format") != DISK_FORMAT:
        raise DiskNodeError(f"{path}: field format: {doc.get('format')!r}, expected {DISK_FORMAT}")
    fields = {k: doc[k] for k in DiskNode.__dataclass_fields__ if k in doc}
    try:
        disk = DiskNode(**fields)
    except TypeError as e:
        raise DiskNodeError(f"{path}: {e}") from None
    for k in ("write_bandwidth", "read_bandwidth"):
        if not getattr(disk, k) > 0:
            raise DiskNodeError(f"{path}: field {k} must be > 0")
    return disk


def stored_disk(machine) -> DiskNode | None:
    """The disk node measured for ``machine`` by ``tilecast calibrate``, or None."""
    path = disk_path(machine)
    return load_disk(path) if os.path.exists(path) else None


def same_file_system(a: str, b: str) -> bool:
    try:
        return os.stat(a).st_dev == os.stat(b).st_dev
    except OSError:
        return False


def other_file_systems(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` both exist on different file systems (a directory gone since says nothing)."""
    try:
        return os.stat(a).st_dev != os.stat(b).st_dev
    except OSError:
        return False


def for_offload_io(disk: DiskNode | None, offload_io: str) -> DiskNode | None:
    """``disk`` as the run's ``--offload-io`` uses it: itself for ``buffered``, :meth:`DiskNode.direct` for
    ``direct``; None stays None."""
    return disk.direct() if disk is not None and offload_io == "direct" else disk


def ensure_disk(machine, directory: str | None = None) -> DiskNode:
    """The disk node of ``machine`` in ``directory`` (default ``$TILECAST_HOME/offload``): the stored one if it
    was measured on the same file system, else measured now in ``directory`` and stored. (A disk node stored
    before the device was measured has no device figures: ``tilecast calibrate --disk-only`` adds them.)"""
    if directory is None:
        directory = str(home("offload"))
        os.makedirs(directory, exist_ok=True)
    disk = stored_disk(machine)
    if disk is not None and same_file_system(disk.directory, directory):
        return disk
    return measure_and_store(machine, directory)[0]


def measure_and_store(machine, directory: str, **measure) -> tuple[DiskNode, str]:
    """(DiskNode, file): the disk node measured in ``directory`` (``measure``: :func:`measure_disk`'s options)
    and stored, keeping the StarPU cost per transfer fitted earlier for ``machine`` (the file system's speed
    does not change it), and the write-back rate and the computing time lost to disk traffic measured earlier
    (``tilecast calibrate --offload-dir``: :mod:`tilecast.perfmodel.io_cpu`) unless they were measured on another
    file system."""
    disk = measure_disk(directory, **measure)
    try:
        old = stored_disk(machine)
    except DiskNodeError:
        old = None
    if old is not None and (old.runtime_latency or old.walk_s or old.walk_tile_s or old.worker_costs):
        disk = replace(disk, runtime_latency=old.runtime_latency, runtime_source=old.runtime_source,
                       walk_s=old.walk_s, walk_tile_s=old.walk_tile_s, walk_tile_source=old.walk_tile_source,
                       worker_costs=dict(old.worker_costs),
                       worker_costs_source=old.worker_costs_source,
                       worker_costs_by_workers=dict(old.worker_costs_by_workers), tile_costs=dict(old.tile_costs),
                       direct_costs=dict(old.direct_costs))
    if (old is not None and old.device_writeback_bandwidth and disk.has_device
            and not other_file_systems(old.directory, directory)):  # the rate is the device's: not another's
        disk = replace(disk, device_writeback_bandwidth=old.device_writeback_bandwidth,
                       device_writeback_source=old.device_writeback_source)
    if old is not None and old.io_cpu_busy and not other_file_systems(old.directory, directory):
        disk = replace(disk, io_cpu_write=old.io_cpu_write, io_cpu_read=old.io_cpu_read, io_cpu_hit=old.io_cpu_hit,
                       io_cpu_busy=old.io_cpu_busy, io_cpu_source=old.io_cpu_source)
    return disk, save_disk(machine, disk)


# No prefetch under a memory limit, unless the environment asks for it: a prefetch to a full main memory evicts
# nothing, fails and is retried at every turn of every worker's progress loop, and each try walks the node's
# whole list of tiles three times under its lock (StarPU 1.3.10, src/datawizard/memalloc.c,
# _starpu_allocate_interface, try_to_reuse_potentially_in_use_mc; data_request.c puts it back on -ENOMEM):
# the walks grow with the tiles the limit holds and slowed memory-limited steps several times (docs/memory.md).
LIMIT_PREFETCH = "0"


def limit_prefetches() -> bool:
    """Whether StarPU prefetches under a memory limit started from this environment (``STARPU_PREFETCH``)."""
    return os.environ.get("STARPU_PREFETCH", LIMIT_PREFETCH).strip() not in ("0", "")
