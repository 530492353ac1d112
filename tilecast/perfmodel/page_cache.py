"""The kernel's page cache in front of the offload device: how long a disk node's transfer takes when the step's
traffic outgrows the cache.

StarPU's unistd disk backend moves a tile with one ``pwrite`` or ``pread`` and never syncs
(:mod:`tilecast.perfmodel.disk_node`), so its transfers go through Linux's page cache. ``calibrate`` times them
with a few MiB, which the cache holds: its figures are the cache's (GB/s). A step that moves tens of GB through a
cache of a few GB meets the device itself. The model, with its sources:

- **Capacity.** The cache can hold what memory the run leaves: ``MemAvailable`` (``/proc/meminfo``; free
  memory and the reclaimable cache) less the memory-limited process (the limit, plus what the process holds
  beyond it: docs/memory.md, "What the process holds beyond the limit"). Pages are kept in least recently used
  order (Linux keeps two LRU lists; one list is the approximation), counted in tiles' bytes.
- **Dirty pages.** A write lands in the cache at the cache's speed and leaves a dirty page. Linux's
  thresholds (``Documentation/admin-guide/sysctl/vm.rst``): past ``dirty_background_ratio`` percent of the
  available memory (free and reclaimable pages) the flusher threads write dirty pages back in the
  background; past ``dirty_ratio`` percent a process generating writes is made to wait for the write-back
  itself (``mm/page-writeback.c``, ``balance_dirty_pages``, which paces the writer to the device's write-back
  rate). ``dirty_bytes``/``dirty_background_bytes``, where set, replace the ratios. The available memory is
  taken to be the cache's capacity (the process's own pages are not dirtyable).
  Here: the flusher drains dirty bytes while they exceed the background threshold, at the rate the device takes
  the write-back at (``DiskNode.device_writeback_bandwidth``: tiles' dirty pages written back by ``fsync``, 3.3
  GB/s on the AMD EPYC guest, where the flusher, started past the background threshold, wrote 0.72 GiB back within
  half a second; else the device's O_DIRECT write bandwidth); a write that would take them past the hard threshold
  waits until the flusher has made room. A stream of writes therefore runs at the cache's speed until the dirty bytes
  reach the threshold, then at the write-back's. (Not modelled: the write-back of pages older than
  ``dirty_expire_centisecs`` below the background threshold, and ``balance_dirty_pages``'s gradual pacing
  between the two thresholds: the writer runs free up to the hard one.)
- **Reads.** A tile whose pages are still cached (written or read recently enough that less than the capacity
  has entered the cache since) is read at the cache's speed; another is read from the device (O_DIRECT
  figures, ``DiskNode.device_*``) and enters the cache. Reads and the write-back share the device: the flusher
  does not stop for a read (measured: the write-back's rate was the same with cold reads beside it), and a read
  issued while the flusher writes back waits for the write-back request ahead of it, one tile's bytes at the
  device's write bandwidth (measured: cold 256 KiB reads took 1.4-1.8 times as long beside the write-back as
  alone; docs/memory.md, 2026-12-01).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass

#: what a memory-limited process holds beyond the limit and its tiles' handles (docs/memory.md, "What the process
#: holds beyond the limit": about 110 MiB of Python and its libraries before StarPU starts, 20 MiB for StarPU's
#: start, 4,472 B per registered tile, measured there)
PROCESS_BASE_BYTES = 130 << 20
HANDLE_BYTES = 4472


@dataclass(frozen=True)
class PageCache:
    """The page cache a memory-limited run leaves to its disk node: its capacity and Linux's dirty thresholds
    (bytes)."""

    capacity_bytes: float
    dirty_bytes: float  # a writer waits for write-back past this (dirty_ratio)
    background_bytes: float  # the flusher writes back past this (dirty_background_ratio)
    source: str = ""

    def describe(self) -> str:
        return (f"page cache {self.capacity_bytes / 2**30:.1f} GiB, dirty thresholds "
                f"{self.background_bytes / 2**30:.2f} / {self.dirty_bytes / 2**30:.2f} GiB")


def run_process_bytes(limit_bytes: int, n_tiles: int) -> int:
    """About what a memory-limited process holds: the limit, its handles and its start (see
    :data:`PROCESS_BASE_BYTES`)."""
    return int(limit_bytes) + PROCESS_BASE_BYTES + int(n_tiles) * HANDLE_BYTES


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def mem_available_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def page_cache_for(process_bytes: int, available_bytes: int | None = None, vm: str = "/proc/sys/vm") -> PageCache:
    """The page cache this machine leaves a process of ``process_bytes``: ``available_bytes`` (default: this
    machine's ``MemAvailable`` now) less the process, and the dirty thresholds of ``vm`` (Linux's defaults, 20
    and 10 percent, where they cannot be read)."""
    avail = mem_available_bytes() if available_bytes is None else int(available_bytes)
    if avail is None:
        avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    capacity = max(float(avail - process_bytes), 0.0)
    ratio = _read_int(os.path.join(vm, "dirty_ratio"))
    bg_ratio = _read_int(os.path.join(vm, "dirty_background_ratio"))
    dirty = _read_int(os.path.join(vm, "dirty_bytes")) or capacity * (20 if ratio is None else ratio) / 100
    background = (_read_int(os.path.join(vm, "dirty_background_bytes"))
                  or capacity * (10 if bg_ratio is None else bg_ratio) / 100)
    return PageCache(capacity, float(min(dirty, capacity)), float(min(background, dirty, capacity)),
                     f"MemAvailable {avail / 2**30:.1f} GiB less the process ({process_bytes / 2**30:.1f} GiB); "
                     f"vm.dirty_ratio {ratio}, dirty_background_ratio {bg_ratio}")


class CachedDisk:
    """The disk node's transfers through the page cache (see the module's docstring), issued one after another in
    time order (the disk link's timeline). ``disk``: a :class:`~tilecast.perfmodel.disk_node.DiskNode` whose
    ``write_*``/``read_*`` figures are the cache's (what calibrate's buffered probe measures) and ``device_*``
    the device's (O_DIRECT)."""

    def __init__(self, disk, cache: PageCache):
        self.cache = cache
        self.w_lat, self.w_inv = disk.write_latency, 1.0 / disk.write_bandwidth
        self.r_lat, self.r_inv = disk.read_latency, 1.0 / disk.read_bandwidth
        self.dw_inv = 1.0 / disk.device_write_bandwidth
        self.wb_inv = 1.0 / disk.flusher_bandwidth  # seconds per byte the flusher writes back
        self.dr_lat, self.dr_inv = disk.device_read_latency, 1.0 / disk.device_read_bandwidth
        self.lru: OrderedDict = OrderedDict()  # tile -> bytes, least recently used first
        self.cached = 0  # bytes in the cache
        self.dirty = 0.0  # dirty bytes
        self.t = 0.0  # the flusher's clock: dirty bytes are known up to this time
        self.hits = self.misses = 0
        self.hit_bytes = self.miss_bytes = 0
        self.reads_behind_writeback = 0  # reads from the device that waited for a write-back request
        self.throttled_s = 0.0  # seconds writers waited for write-back, summed over writers (they overlap)
        self.throttled = []  # (from, to) of each writer's wait for write-back
        self.written_back = 0.0  # bytes the flusher wrote to the device
        self.last_hit = False  # whether the last read found its tile cached
        self.last_device_s = 0.0  # the device's time of the last read that missed (s)

    def next_step(self, after: float = 0.0) -> None:
        """A new step's clock, the last step having ended at ``after`` (s): the cache's contents and dirty bytes
        stay, and so does the write-back the flusher owes its waiting writers beyond that moment (its clock
        carried over)."""
        self.t = self.t - after if self.t > after else 0.0
        self.hits = self.misses = self.hit_bytes = self.miss_bytes = self.reads_behind_writeback = 0
        self.throttled_s = self.written_back = 0.0
        self.throttled = []

    def _flush(self, until: float) -> None:
        """The flusher's write-back from the clock to ``until`` (reads beside it do not stop it)."""
        if until <= self.t:
            return
        bg = self.cache.background_bytes
        if self.dirty > bg:
            done = min(self.dirty - bg, (until - self.t) / self.wb_inv)
            self.dirty -= done
            self.written_back += done
        self.t = until

    def _enter(self, tile: int, nbytes: int) -> None:
        lru = self.lru
        if tile in lru:
            lru.move_to_end(tile)
            self.cached += nbytes - lru[tile]
        else:
            self.cached += nbytes
        lru[tile] = nbytes
        cap = self.cache.capacity_bytes
        while self.cached > cap and lru:
            _, b = lru.popitem(last=False)
            self.cached -= b

    def write(self, tile: int, nbytes: int, start: float) -> float:
        """Seconds a ``pwrite`` of ``tile`` started at ``start`` takes: the cache's, plus the wait for write-back
        where it would take the dirty bytes past the threshold."""
        self._flush(start)
        took = self.w_lat + nbytes * self.w_inv
        over = self.dirty + nbytes - self.cache.dirty_bytes
        if over > 0:  # room is made once the flusher, busy up to its clock with earlier writers', has written over
            begin = start if start > self.t else self.t
            wait = begin + over * self.wb_inv - start
            if wait > took:
                self.throttled_s += wait - took
                self.throttled.append((start + took, start + wait))
                took = wait
        self.dirty += nbytes
        self._enter(tile, nbytes)
        self._flush(start + took)
        return took

    def read(self, tile: int, nbytes: int, start: float) -> float:
        """Seconds a ``pread`` of ``tile`` started at ``start`` takes: the cache's if its pages are still
        cached, else the device's, behind one write-back request of as many bytes where the flusher is writing
        back."""
        self._flush(start)
        if tile in self.lru and self.lru[tile] == nbytes:
            self.lru.move_to_end(tile)
            self.hits += 1
            self.hit_bytes += nbytes
            self.last_hit = True
            return self.r_lat + nbytes * self.r_inv
        took = self.dr_lat + nbytes * self.dr_inv
        self.last_device_s = took
        if self.dirty > self.cache.background_bytes:  # the flusher's request ahead of it on the device
            took += min(nbytes, self.dirty - self.cache.background_bytes) * self.dw_inv
            self.reads_behind_writeback += 1
        self.misses += 1
        self.miss_bytes += nbytes
        self.last_hit = False
        self._enter(tile, nbytes)
        return took

    def throttled_wall_s(self, end: float = float("inf")) -> float:
        """Seconds during which at least one writer waited for write-back (the union of the waits), up to ``end``
        (the step's end: StarPU's tidying write-backs, which no task waits for, can wait beyond it)."""
        wall, until = 0.0, float("-inf")
        for a, b in sorted(self.throttled):
            b = min(b, end)
            if b > until and b > a:
                wall += b - max(a, until)
                until = b
        return wall

    def summary(self, end: float = float("inf")) -> dict:
        """The step's counts; waits for write-back up to ``end`` (s), the step's end."""
        return {"page_cache_read_hits": self.hits, "page_cache_read_misses": self.misses,
                "page_cache_hit_bytes": int(self.hit_bytes), "page_cache_miss_bytes": int(self.miss_bytes),
                "page_cache_throttled_s": self.throttled_s, "page_cache_throttled_wall_s": self.throttled_wall_s(end),
                "page_cache_throttled_writes": len(self.throttled),
                "page_cache_written_back_bytes": int(self.written_back)}
