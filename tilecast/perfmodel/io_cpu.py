"""The computing time a memory-limited step's disk traffic takes from its workers, per byte or per second of I/O.

StarPU's CPU workers never sleep: while their task's tiles are in transfer they poll (StarPU 1.3.10,
``src/drivers/cpu/driver_cpu.c``, ``_starpu_cpu_driver_run_once``), so with as many workers as cores every core is
taken all the step. The page cache's work for the disk node then runs on those same cores: glibc's AIO helper
threads copy each tile between the worker's buffer and the cache (StarPU's unistd backend reads and writes through
``aio_read``/``aio_write``), the flusher writes the dirty pages back, and the kernel allocates and frees the
cache's pages. On the AMD EPYC guest, in a gpt2-xl step under a 12 GiB limit, the workers' threads were runnable
but waiting for a core 35-39 s of each 91-114 s step (docs/memory.md, "The pace beside computing threads").

This measures that time the way it is lost: ``busy`` threads multiply matrices
(:class:`tilecast.perfmodel.writeback_pace.BusyCores`, as many as the cores a step's workers fill) while 256 KiB
tiles are written with buffered ``pwrite`` and then synced (the copies and the write-back), read cold from the
device through the cache, and read again from the cache. The written tiles are in the cache already, clean (their
file made through the cache and synced): a step rewrites each tile's file in place, into pages the cache
holds or has just reclaimed, while a first write into pages the guest has not used lately can cost far more
than the copy (on the Intel Xeon guest, whose first touch of 2 GiB of fresh memory ran at 0.36 GiB/s, a block
written into fresh pages ran at 0.26 GB/s and cost the busy threads 2.9 s per GiB, into cached pages at 1.7 GB/s
and 0.2-0.3 s per GiB; docs/memory.md, 2026-12-02). The threads' products per second during each block,
against their rate in the blocks alone before and after it, give the computing seconds lost:
``busy x (1 - rate during / rate alone) x seconds``, per byte written and per byte read from the cache, and per
second of reading from the device. The device's reads are counted by their time, not their bytes: on the AMD EPYC
guest four blocks read 0.17-0.68 GB/s and lost 0.68-4.19 s per GiB, but 0.42-0.69 s per second (docs/memory.md,
2026-12-02): the loss follows how long the reads are in flight. Not in it: the reclaim of a full page cache (the
cache has room here; in the gpt2-xl step kswapd took about 10 s of a core a step to reclaim 41-46 GiB).

The write block also gives the rate the device takes the page cache's write-back at: the dirty bytes the ``fsync``
found (``/proc/meminfo``'s ``Dirty`` and ``Writeback``, less those before the block) over its seconds
(:attr:`IoCpu.writeback`). The forecast's flusher writes back at that rate
(``DiskNode.device_writeback_bandwidth``): on the AMD EPYC guest 1 GiB took 0.33 s (3.3 GB/s), and the flusher,
started past the background threshold, wrote 0.72 GiB back within half a second (docs/memory.md, "What paced the
stream").

Every file is made in a temporary directory removed at the end, also on an error or Ctrl-C. Used by
``tilecast calibrate --offload-dir``; the forecast charges it to the workers
(:class:`tilecast.simulator.memory_capacity.CappedMemory`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass

from tilecast.perfmodel.writeback_pace import TILE, BusyCores, make_pool, meminfo, shuffled_offsets, tile_buffer

#: bytes moved in each block (written, read cold, read again)
BLOCK_BYTES = 1 << 30
#: seconds the busy threads run alone before and after each block (their rate without the traffic)
ALONE_S = 1.5
#: the fewest dirty bytes an ``fsync`` must write back for its rate to be kept: fewer (the flusher took the rest
#: during the writes) time the call more than the device
MIN_SYNCED_FRACTION = 0.25


@dataclass(frozen=True)
class IoCpu:
    """Seconds of computing lost by ``busy`` threads per byte written (``write``: the copy into the cache and the
    write-back), per second of reading from the device through the cache (``read``) and per byte read from the
    cache (``hit``), and what each block measured."""

    write: float
    read: float
    hit: float
    busy: int
    blocks: dict
    directory: str
    load_average: float
    nbytes: int = BLOCK_BYTES  # bytes moved in each block
    writeback: float = 0.0  # bytes/s the device took the write block's write-back at (its fsync); 0: not measured
    synced_bytes: int = 0  # the dirty bytes that fsync wrote back
    sync_s: float = 0.0  # its seconds

    def to_dict(self) -> dict:
        return asdict(self)

    def source(self, by: str) -> str:
        rates = ", ".join(f"{k} {b['gbps']:.2f} GB/s" for k, b in self.blocks.items())
        return (f"measured: {by}, {self.nbytes / 2**30:.2f} GiB of 256 KiB tiles in each block ({rates}) beside "
                f"{self.busy} threads multiplying matrices, their products per second against theirs alone; load average "
                f"{self.load_average:.1f}")

    def writeback_source(self, by: str) -> str:
        return (f"measured: {by}, {self.synced_bytes / 2**30:.2f} GiB of 256 KiB tiles' dirty pages written back by "
                f"fsync in {self.sync_s:.2f} s beside {self.busy} threads multiplying matrices; load average "
                f"{self.load_average:.1f}")


def _rate(busy: BusyCores, seconds: float) -> float:
    """Products per second of ``busy`` over the next ``seconds``."""
    p0, t0 = sum(busy.products), time.perf_counter()
    time.sleep(seconds)
    return (sum(busy.products) - p0) / (time.perf_counter() - t0)


def _block(busy: BusyCores, work) -> tuple[float, float]:
    """(products per second, seconds) of ``busy`` while ``work()`` runs."""
    p0, t0 = sum(busy.products), time.perf_counter()
    work()
    return (sum(busy.products) - p0) / (time.perf_counter() - t0), time.perf_counter() - t0


def lost_seconds(alone_before: float, during: float, alone_after: float, seconds: float, busy: int) -> float:
    """Computing seconds lost: ``busy`` threads ran ``during`` products/s for ``seconds`` against the mean of their
    rates alone around it; 0 where they lost nothing (noise above their rate alone)."""
    alone = (alone_before + alone_after) / 2
    if alone <= 0:
        return 0.0
    return max(busy * (1.0 - during / alone) * seconds, 0.0)


def measure_io_cpu(directory: str, busy: int, nbytes: int = BLOCK_BYTES, alone_s: float = ALONE_S,
                   progress=None) -> IoCpu:
    """The blocks of the module's docstring in ``directory`` beside ``busy`` computing threads, ``nbytes`` each.
    ``progress``: called with the name of each block as it starts. Raises OSError where the directory refuses
    the files (O_DIRECT on tmpfs), ValueError for ``busy`` under 1."""
    if busy < 1:
        raise ValueError("the computing time lost needs at least one busy thread")
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"no such directory {directory}")
    n = max(int(nbytes) // TILE, 1)
    work = tempfile.mkdtemp(prefix=".tilecast-io-cpu-", dir=directory)
    try:
        written, cold = os.path.join(work, "written"), os.path.join(work, "read")
        make_pool(written, n, cached=True)  # the measured block rewrites pages the cache holds
        make_pool(cold, n)  # O_DIRECT: on the device, not in the cache
        buf = tile_buffer()
        offsets = shuffled_offsets(n, 5)

        sync = {}

        def write():
            fd = os.open(written, os.O_WRONLY)
            try:
                m = meminfo()
                dirty0 = m["Dirty"] + m["Writeback"]
                for o in offsets:
                    os.pwrite(fd, buf, o)
                m = meminfo()
                t = time.perf_counter()
                os.fsync(fd)  # the write-back inside the block
                sync["s"] = time.perf_counter() - t
                sync["bytes"] = min(max(m["Dirty"] + m["Writeback"] - dirty0, 0), n * TILE)
            finally:
                os.close(fd)

        def read():
            fd = os.open(cold, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # a tile at a time, as StarPU's files are read
                for o in offsets:
                    os.preadv(fd, [buf], o)
            finally:
                os.close(fd)

        blocks = {}
        with BusyCores(busy) as cores:
            before = _rate(cores, alone_s)
            for name, fn in (("write", write), ("read", read), ("hit", read)):
                if progress is not None:
                    progress(name)
                during, seconds = _block(cores, fn)
                after = _rate(cores, alone_s)
                lost = lost_seconds(before, during, after, seconds, busy)
                blocks[name] = {"alone_before": before, "during": during, "alone_after": after, "seconds": seconds,
                                "gbps": n * TILE / seconds / 1e9, "lost_s": lost,
                                "lost_s_per_gib": lost / (n * TILE) * 2**30, "lost_s_per_s": lost / seconds}
                before = after
    finally:
        shutil.rmtree(work, ignore_errors=True)
    synced = sync["bytes"] >= MIN_SYNCED_FRACTION * n * TILE and sync["s"] > 0
    return IoCpu(blocks["write"]["lost_s"] / (n * TILE), blocks["read"]["lost_s_per_s"],
                 blocks["hit"]["lost_s"] / (n * TILE), busy, blocks, os.path.abspath(directory), os.getloadavg()[0],
                 n * TILE, sync["bytes"] / sync["s"] if synced else 0.0, int(sync["bytes"]), sync["s"])
