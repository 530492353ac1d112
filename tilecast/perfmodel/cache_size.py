"""The cache a task's inputs must stay in to be hot: this machine's level-2 cache per core; and its last level.

Read from Linux's sysfs (``/sys/devices/system/cpu/cpu0/cache/index*/``): the
level-2 entry's ``size`` divided by the number of CPUs in its
``shared_cpu_list`` (an L2 shared by a cluster of cores is split among
them). Where sysfs does not say (another OS, a container hiding it), the
fallback is :data:`FALLBACK_L2_BYTES`, 1 MiB, the per-core L2 of most server
cores of recent years (Intel Skylake-SP to Ice Lake-SP: 1-1.25 MiB; AMD Zen 4: 1 MiB).
"""

from __future__ import annotations

import glob
import os

FALLBACK_L2_BYTES = 1 << 20
SYSFS_CACHE = "/sys/devices/system/cpu/cpu0/cache"


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def parse_size(text: str) -> int:
    """Bytes of a sysfs cache size such as ``2048K`` or ``1M``."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def cpu_list_count(text: str) -> int:
    """How many CPUs a sysfs list such as ``0-3,8`` names."""
    n = 0
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


def l2_per_core(root: str = SYSFS_CACHE) -> tuple[int, str]:
    """(bytes, where the figure comes from): cpu0's level-2 cache over the CPUs sharing it, or the fallback."""
    for d in sorted(glob.glob(os.path.join(root, "index*"))):
        try:
            if _read(os.path.join(d, "level")) != "2" or _read(os.path.join(d, "type")) not in ("Unified", "Data"):
                continue
            size = parse_size(_read(os.path.join(d, "size")))
            sharing = max(cpu_list_count(_read(os.path.join(d, "shared_cpu_list"))), 1)
        except (OSError, ValueError):
            continue
        if size > 0:
            return size // sharing, (f"detected: {d}/size {size >> 10} KiB shared by {sharing} CPU"
                                     f"{'s' if sharing > 1 else ''}")
    return FALLBACK_L2_BYTES, "assumed: sysfs gives no level-2 cache here (tilecast.perfmodel.cache_size fallback)"


def _last_level_entry(root: str):
    """(level, bytes, CPUs sharing it, sysfs folder) of cpu0's highest data or unified cache, or None."""
    best = None
    for d in sorted(glob.glob(os.path.join(root, "index*"))):
        try:
            if _read(os.path.join(d, "type")) not in ("Unified", "Data"):
                continue
            level = int(_read(os.path.join(d, "level")))
            size = parse_size(_read(os.path.join(d, "size")))
            sharing = max(cpu_list_count(_read(os.path.join(d, "shared_cpu_list"))), 1)
        except (OSError, ValueError):
            continue
        if size > 0 and (best is None or level > best[0]):
            best = (level, size, sharing, d)
    return best


def last_level(root: str = SYSFS_CACHE) -> tuple[int, int, str]:
    """(bytes, CPUs sharing it, where the figure comes from) of cpu0's last-level cache (the highest level
    of data or unified cache sysfs lists, whole), or (0, 1, why) where sysfs does not say."""
    best = _last_level_entry(root)
    if best is None:
        return 0, 1, "unknown: sysfs lists no cache here"
    level, size, sharing, d = best
    return size, sharing, (f"detected: {d}/size, level {level}, {size >> 10} KiB shared by {sharing} CPU"
                           f"{'s' if sharing > 1 else ''}")


def llc_per_core(root: str = SYSFS_CACHE) -> tuple[int, str]:
    """(bytes, where the figure comes from): cpu0's shared last-level cache (level 3 or above) over the CPUs
    sharing it, the share of it one core's tiles can count on; (0, why) where there is none beyond the
    level-2 cache or sysfs does not say. A tile evicted from the level-2 cache but touched within that many
    bytes comes back from this cache, not from main memory (tilecast.perfmodel.reuse)."""
    best = _last_level_entry(root)
    if best is None or best[0] < 3:
        return 0, "none: sysfs lists no cache beyond level 2 here"
    level, size, sharing, d = best
    return size // sharing, (f"detected: {d}/size, level {level}, {size >> 10} KiB shared by {sharing} CPU"
                             f"{'s' if sharing > 1 else ''}")
