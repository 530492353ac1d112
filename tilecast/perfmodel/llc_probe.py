"""The share of the last-level cache one core's tiles can count on, measured where sysfs may overstate it.

:func:`tilecast.perfmodel.cache_size.llc_per_core` divides the level-3 size sysfs lists by the CPUs sharing
it. In a virtual machine that is the host's cache: the 2-core Intel Xeon KVM guest lists 480 MiB shared by its
2 CPUs (240 MiB a core), while a read-and-write stream on both cores at once ran 25-27 GiB/s up to 24 MiB read
plus 24 MiB written per core, 20-21 at 32 + 32 MiB and 13-16 from 48 + 48 MiB on, as from main memory
(2026-12-05): the guest's tiles stay in that cache within about 50 MiB a core, the rest of it being other
tenants'. A tile whose reuse distance lies between the two comes back at main memory's speed, not the
shared cache's (:mod:`tilecast.perfmodel.reuse`), so calibration measures the share (:func:`measure`) and
keeps the smaller of the two.

The measure: every core streams (``b = a + 1`` over float32 buffers ``a`` and ``b``, each half the footprint)
at once, over footprints doubling by half steps from four level-2 caches to twice the sysfs share; the
rate (the median of :data:`RUNS` sweeps) has its *plateau* in the median over the three smallest footprints, its *floor* the rate at the largest;
the share is the largest footprint still at least halfway from the floor to the plateau (:func:`knee`).
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

#: the least plateau-over-floor ratio at which a knee is read: below it the stream shows no cache level
MIN_DROP = 1.25
#: seconds of streaming per footprint and core (at least 2 passes)
SECONDS_PER_SIZE = 0.06
#: the most memory the probe takes, as a share of what the system has available
MEMORY_SHARE = 0.25
#: runs of the whole sweep, each footprint's rate their median (one run's knee moved by a half step, 45 to 64 MiB)
RUNS = 3
#: the longest a thread waits for the others at a footprint's start or end before the sweep is given up
BARRIER_S = 60.0


def footprints(l2_bytes: float, sysfs_share: float) -> list[int]:
    """Footprints per core (bytes, a multiple of 8): from 4 x ``l2_bytes`` up to 2 x ``sysfs_share``, each
    about 1.41 times the last (powers of two and the midpoints between them)."""
    lo, hi = max(4 * float(l2_bytes), 1 << 20), max(2 * float(sysfs_share), 8 * float(l2_bytes))
    out, k = [], int(np.floor(2 * np.log2(lo)))
    while True:
        size = int(2 ** (k / 2)) // 8 * 8
        k += 1
        if size < lo:
            continue
        if size > hi:
            return out
        out.append(size)


def knee(sizes, rates) -> int | None:
    """The largest footprint whose rate is at least halfway from the floor (the last footprint's rate) to the
    plateau (the median of the first three), or None where the plateau is less than :data:`MIN_DROP` times the
    floor (no level to find) or fewer than 4 footprints were measured."""
    sizes, rates = np.asarray(sizes, dtype=np.float64), np.asarray(rates, dtype=np.float64)
    if len(sizes) < 4 or not np.isfinite(rates).all():
        return None
    plateau, floor = float(np.median(rates[:3])), float(rates[-1])
    if not plateau >= MIN_DROP * floor:
        return None
    ok = rates >= floor + 0.5 * (plateau - floor)
    i = int(np.argmax(ok))  # the first footprint above the line, then the run of those after it
    while i + 1 < len(ok) and ok[i + 1]:  # (a footprint above the line after one below it is noise)
        i += 1
    return int(sizes[i])


def stream_rates(sizes, cores: int) -> np.ndarray:
    """Bytes per second (read and written) per core, the median over ``cores`` threads (each pinned to its own
    CPU where the system allows) streaming at once, for each footprint in ``sizes``."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    cores = max(1, int(cores))
    rates = np.full((len(sizes), cores), np.nan)
    barrier = threading.Barrier(cores)

    def run(c):
        if len(cpus) >= cores:
            try:
                os.sched_setaffinity(0, {cpus[c]})  # the calling thread's own mask (Linux)
            except OSError:
                pass
        try:
            for i, size in enumerate(sizes):
                n = int(size) // 8  # float32 elements of each of the two buffers
                a, b = np.ones(n, dtype=np.float32), np.empty(n, dtype=np.float32)
                np.add(a, 1.0, out=b)  # pages touched, caches warmed
                barrier.wait(BARRIER_S)
                passes, t0 = 0, time.perf_counter()
                while passes < 2 or time.perf_counter() - t0 < SECONDS_PER_SIZE:
                    np.add(a, 1.0, out=b)
                    passes += 1
                rates[i, c] = passes * 8.0 * n / (time.perf_counter() - t0)
                del a, b
                barrier.wait(BARRIER_S)
        except (threading.BrokenBarrierError, MemoryError):  # one thread failed or stalled: the rest stop too
            barrier.abort()  # (the footprints not measured stay NaN: no knee is read from them)

    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in range(cores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return np.median(rates, axis=1)


def measure(l2_bytes: float, sysfs_share: float, cores: int) -> tuple[int | None, str]:
    """(bytes per core, how it was found) of the shared cache's share, measured with ``cores`` cores streaming
    at once; (None, why) where there is nothing to measure (no level beyond level 2 in sysfs), not enough
    memory for the footprints, or no knee in the rates."""
    if not sysfs_share > 0:
        return None, "not measured: sysfs lists no cache beyond level 2"
    sizes = footprints(l2_bytes, sysfs_share)
    from tilecast.perfmodel.page_cache import mem_available_bytes

    avail = mem_available_bytes()
    if avail:
        sizes = [s for s in sizes if s * max(cores, 1) <= MEMORY_SHARE * avail]
    if len(sizes) < 4:
        return None, "not measured: too little memory available for the stream's footprints"
    rates = np.median([stream_rates(sizes, cores) for _ in range(RUNS)], axis=0)
    found = knee(sizes, rates)
    mib, gib = 1 << 20, 1 << 30
    seen = (f"a read-and-write stream on {cores} core{'s' if cores > 1 else ''} at once: "
            f"{rates[0] / gib:.1f} GiB/s a core at {sizes[0] / mib:.0f} MiB, {rates[-1] / gib:.1f} at "
            f"{sizes[-1] / mib:.0f} MiB")
    if found is None:
        return None, f"no knee: {seen}"
    return found, f"measured: {seen}, at least halfway between them up to {found / mib:.0f} MiB"


#: (level-2 bytes, sysfs share, cores) -> measure()'s answer: measured once per process (about 4 s on the
#: 2-core Xeon), whatever number of calibrations it runs
_MEASURED: dict = {}


def effective_llc_per_core(l2_bytes: float, cores: int) -> tuple[float, str]:
    """(bytes, source) for ``Calibration.llc_bytes``: the smaller of sysfs's share per core
    (:func:`tilecast.perfmodel.cache_size.llc_per_core`) and the measured one (:func:`measure`); sysfs's where
    nothing was measured, with the reason."""
    from tilecast.perfmodel.cache_size import llc_per_core

    share, source = llc_per_core()
    key = (float(l2_bytes), float(share), int(cores))
    if key not in _MEASURED:
        _MEASURED[key] = measure(l2_bytes, share, cores)
    found, how = _MEASURED[key]
    if found is None or found >= share:
        return float(share), source + (f"; {how}" if share > 0 else "")
    return float(found), f"{how} ({source})"
