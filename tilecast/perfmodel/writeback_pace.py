"""The pace a stream of buffered tile writes keeps once the dirty bytes reach Linux's background threshold.

StarPU's unistd disk node writes evicted tiles with buffered ``pwrite`` calls (:mod:`tilecast.perfmodel.disk_node`).
This measures what such writes sustain past the page cache's first gigabytes: a pool of 256 KiB tiles is written
once with ``O_DIRECT`` (on the device: StarPU rewrites a tile's file in place), then rewritten with buffered
writes, each tile once, in shuffled order, as fast as they go, for at most ``seconds``; ``/proc/meminfo``'s
``Dirty`` and ``Writeback`` are sampled beside the bytes written. Once the dirty bytes hold still, the paced rate
is what was written back: the slope against time of the bytes written less the dirty bytes (from 90% of their level
over the stream's second half, or from where they fell back to it after overshooting, after a second to settle).
The thresholds are read as :func:`tilecast.perfmodel.page_cache.page_cache_for` reads them (the pool: twice the
hard threshold and 1 GiB). A level under half the background threshold, dirty bytes that do not hold, or a pool or
a time too small to get there give no pace (:attr:`WritebackPace.paced` false).

What the pace is depends on the machine. It was taken for the flusher's (``balance_dirty_pages`` pacing a writer
to the write-back) until, on the AMD EPYC guest, an 8 GiB stream wrote 4.9 GiB in 1.7 s and then 0.1 GB/s with
the dirty bytes under the background threshold, where no writer is paced, while the flusher wrote back in
bursts of 0.3 GiB, and fresh anonymous memory took 7.2 s per 2 GiB on first touch against 0.35 s after
(the hypervisor takes back the guest's free pages: virtio-balloon free page reporting): the stream's pace there
follows the first touch of the cache's new pages, which would explain why it moved from 0.10 to 0.39 GB/s
(docs/memory.md, "What paced the stream"). ``tilecast calibrate`` no longer runs it: the forecast's flusher writes at
the device's write-back rate (:mod:`tilecast.perfmodel.io_cpu`). ``busy`` threads multiplying matrices (one BLAS
thread each, as a StarPU worker runs its kernels) may run beside the stream (:class:`BusyCores`, also used by
:mod:`tilecast.perfmodel.io_cpu`).

Every file is made in a temporary directory removed at the end, also on an error or Ctrl-C. Used by
``benchmarks/disk_contention.py``.
"""

from __future__ import annotations

import mmap
import os
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field

#: StarPU's transfer of a 256 x 256 float32 tile: one pwrite of the whole tile
TILE = 256 << 10
#: the longest the buffered stream runs (s), after its pool is written
STREAM_S = 15.0
#: seconds between samples of /proc/meminfo during the stream
SAMPLE_S = 0.1
#: seconds of the paced stream dropped before the fit (balance_dirty_pages settles on its pace)
SETTLE_S = 1.0
#: the fewest seconds of paced stream a pace is fitted on
MIN_PACED_S = 2.0
#: the pool: this many times the hard threshold, and a margin beyond, and its cap. Once, the hard threshold and 1
#: GiB (5.6 GiB) was too little: with the whole page cache free the flusher kept the dirty bytes at 3.6 GiB, under
#: balance_dirty_pages' free-run ceiling (halfway between the thresholds, 3.7 GiB), and the stream ran out in 1.5 s
#: unpaced (docs/memory.md, "The write-back pace's stream, too short once")
POOL_THRESHOLDS = 2
POOL_MARGIN_BYTES = 1 << 30
POOL_CAP_BYTES = 16 << 30


def meminfo(path: str = "/proc/meminfo") -> dict:
    """Bytes of ``Dirty``, ``Writeback``, ``MemFree``, ``MemAvailable`` now."""
    out = {}
    with open(path) as f:
        for line in f:
            k, v = line.split(":")
            if k in ("Dirty", "Writeback", "MemFree", "MemAvailable"):
                out[k] = int(v.split()[0]) * 1024
    return out


def tile_buffer():
    """A page-aligned tile of random bytes (O_DIRECT needs the alignment)."""
    b = mmap.mmap(-1, TILE)
    b.write(os.urandom(TILE))
    return b


def make_pool(path: str, n: int, progress=None, cached: bool = False) -> str:
    """One file of ``n`` tiles, written once with ``O_DIRECT`` (on the device, not in the cache; StarPU gives each
    tile its own file, made at its first write-back and rewritten in place later: one file here, its tiles
    rewritten at shuffled offsets so that neighbouring tiles are not merged into one request). ``cached``:
    written through the page cache and synced instead, so that its tiles are in the cache, clean. ``progress``:
    called with the bytes of each tile written."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | (0 if cached else os.O_DIRECT), 0o600)
    buf = tile_buffer()
    try:
        for i in range(n):
            os.pwrite(fd, buf, i * TILE)
            if progress is not None:
                progress(TILE)
        if cached:
            os.fsync(fd)
    finally:
        os.close(fd)
    return path


def shuffled_offsets(n: int, seed: int) -> list[int]:
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return [i * TILE for i in order]


def write_tiles(path: str, n: int, direct: bool, rate: float, seconds: float, sample=None) -> list:
    """Rewrites the pool's tiles (shuffled) for ``seconds``, each at most once (a step's write-backs of distinct
    tiles: a rewrite of a page still dirty would add no dirty byte), at most ``rate`` bytes/s (0: as fast as
    they go). ``sample``: called about every :data:`SAMPLE_S` seconds and at the end with (seconds since the
    start, bytes written). Returns (start, seconds) of each ``pwrite``."""
    fd = os.open(path, os.O_WRONLY | (os.O_DIRECT if direct else 0))
    offsets = shuffled_offsets(n, 2)
    buf = tile_buffer()
    out, i = [], 0
    begin = time.perf_counter()
    end, next_sample = begin + seconds, begin
    try:
        while i < n:
            t = time.perf_counter()
            if rate and begin + i * TILE / rate > t:
                time.sleep(begin + i * TILE / rate - t)
                t = time.perf_counter()
            if sample is not None and t >= next_sample:
                sample(t - begin, i * TILE)
                next_sample = t + SAMPLE_S
            if t > end:
                break
            os.pwrite(fd, buf, offsets[i])
            out.append((t, time.perf_counter() - t))
            i += 1
        if sample is not None:
            sample(time.perf_counter() - begin, i * TILE)
    finally:
        os.close(fd)
    return out


def stats(rec, since: float | None = None) -> dict:
    """Count, GB/s over the wall time, and mean/median/90th percentile (ms) of (start, seconds) records."""
    if since is not None:
        rec = [r for r in rec if r[0] >= since]
    if not rec:
        return {"n": 0}
    times = sorted(d for _, d in rec)
    n = len(times)
    wall = rec[-1][0] + rec[-1][1] - rec[0][0]
    return {"n": n, "gbps": n * TILE / wall / 1e9, "mean_ms": 1e3 * sum(times) / n, "p50_ms": 1e3 * times[n // 2],
            "p90_ms": 1e3 * times[int(n * 0.9)], "wall_s": wall}


#: the dirty bytes' level must be at least this share of the background threshold read from /proc (the kernel's
#: dirtyable memory, free and file pages, is less than MemAvailable: the level was 0.96 of it on the AMD EPYC guest)
LEVEL_SHARE = 0.5
#: while paced, the dirty bytes move by at most this share of the bytes written
HOLD_SHARE = 0.25
#: dirty bytes past this multiple of their level overshot it: with the page cache free they rose at the cache's
#: speed to 3.3-3.7 GiB, then fell back to a level of 2.1-2.2 GiB, where the writer was paced (docs/memory.md,
#: "The write-back pace's stream, too short once")
OVERSHOOT = 1.1


def paced_rate(samples, background_bytes: float, settle_s: float = SETTLE_S,
               min_span_s: float = MIN_PACED_S) -> tuple[float, float | None, str]:
    """(bytes/s, seconds, why not) of the paced stream in ``samples`` ((seconds, bytes written, dirty bytes), in
    time order; dirty: ``Dirty`` + ``Writeback``, what ``balance_dirty_pages`` holds at its set point): the
    least-squares slope against time of the bytes written less the dirty bytes (what the flusher wrote back) from
    ``settle_s`` after the dirty bytes first reached 90%
    of their level (their median over the stream's second half), or, where they first ran past
    :data:`OVERSHOOT` times it, after they fell back under that, and that moment. No pace (0) where the level is
    under :data:`LEVEL_SHARE` of ``background_bytes`` (the flusher never had to keep up; moment None), where
    less than ``min_span_s`` of stream followed, or where the dirty bytes did not hold (they moved by more than
    :data:`HOLD_SHARE` of the bytes written: the stream was not paced); ``why not`` says which."""
    import numpy as np

    if len(samples) < 3:
        return 0.0, None, "the stream ended before its dirty bytes were sampled"
    late = [d for t, _, d in samples if t >= samples[-1][0] / 2]
    level = float(np.median(late))
    if level < LEVEL_SHARE * background_bytes:
        return 0.0, None, (f"the dirty bytes stayed at {level / 2**30:.2f} GiB, under {LEVEL_SHARE:.0%} of the "
                           f"background threshold {background_bytes / 2**30:.2f} GiB")
    reached = next(t for t, _, dirty in samples if dirty >= 0.9 * level)
    peak = max(range(len(samples)), key=lambda i: samples[i][2])
    if samples[peak][2] > OVERSHOOT * level:  # they ran past the level first, then fell back to it: paced from there
        back = next((t for t, _, dirty in samples[peak:] if dirty <= OVERSHOOT * level), None)
        reached = reached if back is None else back  # (never back: they kept rising, which the hold test refuses)
    kept = [(t, b, d) for t, b, d in samples if t >= reached + settle_s]
    if len(kept) < 3 or kept[-1][0] - kept[0][0] < min_span_s:
        return 0.0, reached, (f"the stream ended {samples[-1][0] - reached:.1f} s after the dirty bytes reached "
                              f"their level, under {settle_s + min_span_s:.0f} s")
    t, b, d = np.asarray(kept, float).T
    if abs(d[-1] - d[0]) > HOLD_SHARE * (b[-1] - b[0]):
        return 0.0, reached, (f"the dirty bytes moved by {abs(d[-1] - d[0]) / 2**20:.0f} MiB while "
                              f"{(b[-1] - b[0]) / 2**20:.0f} MiB were written: not paced")
    slope = float(np.polyfit(t, b - d, 1)[0])
    return (slope, reached, "") if slope > 0 else (0.0, reached, "no bytes written once paced")


@dataclass(frozen=True)
class WritebackPace:
    """A write stream past the dirty threshold (:func:`measure_writeback`). ``bandwidth``: the paced rate
    (bytes/s), 0 where the stream was not paced (``reason`` says why); ``stream_bandwidth``:
    the whole stream's rate."""

    bandwidth: float
    stream_bandwidth: float
    paced_from_s: float | None
    seconds: float
    written_bytes: int
    pool_bytes: int
    background_bytes: float
    dirty_bytes: float
    dirty_max_bytes: int
    directory: str
    load_average: float
    reason: str = ""
    busy: int = 0  # threads computing beside the stream (BusyCores)
    #: (seconds, bytes written, dirty and write-back bytes) sampled during the stream
    samples: tuple = field(default=(), repr=False)

    @property
    def paced(self) -> bool:
        return self.bandwidth > 0

    def to_dict(self, samples: bool = False) -> dict:
        out = {**asdict(self), "paced": self.paced}
        if not samples:
            del out["samples"]
        return out


class NoRoom(RuntimeError):
    """The directory has too little free space for the stream's pool."""


def pool_for(directory: str, thresholds, cap: int | None = None) -> int:
    """Bytes of the pool a stream in ``directory`` rewrites: :data:`POOL_THRESHOLDS` times the hard threshold and
    :data:`POOL_MARGIN_BYTES` beyond (at most ``cap``, default :data:`POOL_CAP_BYTES`), a whole number of tiles,
    so that the dirty bytes pass the free-run ceiling even while the flusher writes back at the device's speed,
    and seconds of paced stream follow; :class:`NoRoom` where that is over half of the directory's free space."""
    cap = POOL_CAP_BYTES if cap is None else cap
    want = min(POOL_THRESHOLDS * int(thresholds.dirty_bytes) + POOL_MARGIN_BYTES, cap) // TILE * TILE
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    if want > free // 2:
        raise NoRoom(f"the write-back stream needs {want / 2**30:.1f} GiB in {directory}, which has "
                     f"{free / 2**30:.1f} GiB free (at most half is used)")
    return want


#: the matrices the busy threads multiply (float32, n x n): an in-cache SGEMM of a few milliseconds
BUSY_N = 256


class BusyCores:
    """``n`` threads multiplying matrices until the block ends, each with one BLAS thread (numpy releases the
    GIL in the product): a StarPU worker's load beside the write stream. ``products``: how many each did."""

    def __init__(self, n: int):
        import threading

        self.n = n
        self.products = [0] * n
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)]

    def _run(self, i: int) -> None:
        import numpy as np

        a = np.random.default_rng(i).random((BUSY_N, BUSY_N), dtype=np.float32)
        while not self._stop.is_set():
            a = a @ a
            a *= 1.0 / max(float(abs(a[0, 0])), 1.0)  # kept finite
            self.products[i] += 1

    def __enter__(self):
        from threadpoolctl import threadpool_limits

        self._limits = threadpool_limits(1) if self.n else None
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for t in self._threads:
            t.join()
        if self._limits is not None:
            self._limits.restore_original_limits()
        return False


def measure_writeback(directory: str, seconds: float = STREAM_S, pool_bytes: int | None = None, thresholds=None,
                      progress=None, busy: int = 0) -> WritebackPace:
    """The write stream of the module's docstring in ``directory``: at most ``seconds`` of buffered writes of a
    pool of ``pool_bytes`` (default: :func:`pool_for`, which raises :class:`NoRoom`) made first with
    ``O_DIRECT``. ``thresholds``: a :class:`~tilecast.perfmodel.page_cache.PageCache` (default: this machine's
    now, for no process). ``progress``: called with (phase, bytes done, bytes in all), phase ``pool`` then
    ``stream``. ``busy``: threads kept computing during the stream (:class:`BusyCores`; 0: none). Raises OSError
    where the directory refuses the files (O_DIRECT on tmpfs)."""
    from tilecast.perfmodel.page_cache import page_cache_for

    if not os.path.isdir(directory):
        raise FileNotFoundError(f"no such directory {directory}")
    cache = thresholds if thresholds is not None else page_cache_for(0)
    pool = pool_for(directory, cache) if pool_bytes is None else max(int(pool_bytes) // TILE, 1) * TILE
    n = pool // TILE
    work = tempfile.mkdtemp(prefix=".tilecast-writeback-", dir=directory)
    samples = []
    try:
        path = os.path.join(work, "pool")
        made = [0]

        def made_one(nbytes):
            made[0] += nbytes
            if progress is not None and made[0] % (64 * TILE) == 0:
                progress("pool", made[0], pool)

        make_pool(path, n, made_one)

        def sample(t, written):
            m = meminfo()
            samples.append((t, written, m["Dirty"] + m["Writeback"]))
            if progress is not None:
                progress("stream", written, pool)

        with BusyCores(busy):
            rec = write_tiles(path, n, False, 0.0, seconds, sample)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # unlinking drops the dirty pages: no write-back owed
    rate, reached, why = paced_rate(samples, cache.background_bytes)
    wall = samples[-1][0] if samples else 0.0
    written = len(rec) * TILE
    dirty_max = max((d for _, _, d in samples), default=0)
    reason = f"{why} (pool {pool / 2**30:.2f} GiB, at most {seconds:.0f} s)" if why else ""
    return WritebackPace(rate, written / wall if wall > 0 else 0.0, reached, wall, written, pool,
                         cache.background_bytes, cache.dirty_bytes, dirty_max, os.path.abspath(directory),
                         os.getloadavg()[0], reason, busy, tuple(samples))
