"""A limit on the main memory StarPU may use for tiles, and the disk directory evicted tiles go to.

With a limit, every tile is StarPU-managed (:mod:`tilecast.executor.managed_tiles`),
StarPU starts with ``STARPU_LIMIT_CPU_MEM`` (MiB) and, given an offload
directory, a disk memory node (``starpu_disk_register`` with the unistd
backend) to which it writes back tiles it evicts from main memory
(StarPU 1.3.10, ``src/datawizard/memalloc.c``, ``choose_target``: a tile with
no home node that must leave main memory goes to the disk node).

**The smallest working set** (:func:`minimum_bytes`) is what a step needs in
main memory at once for StarPU to make progress:

- with a disk node, ``workers`` x the largest task's buffers (every worker
  holds the tiles of the task it runs, all in main memory at once) plus the
  largest tile (the host reads and writes one tile at a time through
  ``starpu_data_acquire``), plus :data:`SLACK_BYTES`. Measured here
  (gpt2-tiny, batch 8 x 128, 2 workers, dmda): tiles of 64 (largest task
  1.01 MiB) run at a 2 MiB limit and hang at 1 MiB; tiles of 128 (largest
  task 4.02 MiB) run at 8 MiB. StarPU takes the limit in whole MiB, hence the
  slack;
- without one, every tile of the graphs (nothing can be evicted: a tile's only
  copy must stay in main memory).

A limit below it is refused before StarPU starts.

**What the process holds beyond the limit** (:func:`overhead_bytes`): the limit
bounds the tiles StarPU allocates, not the process. Measured here (gpt2-xl,
tile 256: 98,316 tiles), the rest of the resident set is the process before
StarPU starts (Python, numpy, the kernels, the task graph: about 56 MiB), what
StarPU takes when it starts (:data:`STARPU_START_BYTES`: its workers, buffers
and OpenBLAS's), and StarPU's own record of every registered tile
(:data:`HANDLE_BYTES` each, whether the tile is in memory, on disk or not yet
allocated). The tiles' buffers themselves stay within the limit once freed
buffers go back to the system (:func:`map_tile_buffers`).
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
import shutil
import tempfile
from dataclasses import dataclass

import numpy as np


from tilecast.graph.working_set import (MIB, SLACK_BYTES, format_size, largest_task_bytes,  # noqa: F401
                                        minimum_bytes, refusal, tile_bytes)
# Whether memory-limited runs prefetch: defined beside the disk node's model, which the simulator reads too.
from tilecast.perfmodel.disk_node import LIMIT_PREFETCH, limit_prefetches  # noqa: F401

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*$")


# StarPU 1.3.10's record of one registered vector tile, measured here: 98,316 tiles registered with
# home node -1 raised the resident set by 419.3 MiB (4,472 bytes each). Most of it is the handle's
# per-node replicates, inline for STARPU_MAXNODES (16 in Debian's build) memory nodes, and the vector
# interface it allocates for each node and each worker (src/datawizard/coherency.h, struct
# _starpu_data_state; src/datawizard/interfaces/data_interface.c, _starpu_register_new_data).
HANDLE_BYTES = 4472
# What starting StarPU and running its first tasks added to the resident set, measured here (2 CPU
# workers, a disk node; benchmarks/out_of_core.py on gpt2-tiny: 18 MiB besides the handles): the
# kernels' library and OpenBLAS loaded, the workers' stacks and buffers.
STARPU_START_BYTES = 20 * MIB


class MemoryLimitError(ValueError):
    """A memory limit or offload directory that cannot be used; one line naming the field."""


def parse_size(text: str, field: str = "memory_limit") -> int:
    """Bytes in ``text``: a number with an optional unit, B, kB/MB/GB/TB (powers of 10) or
    KiB/MiB/GiB/TiB (powers of 2), e.g. ``12GiB``, ``512MiB``, ``1.5GB``, ``1000000``."""
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise MemoryLimitError(f"{field}: {text!r} is not a size (use e.g. 12GiB, 512MiB, 1.5GB or a number of "
                               "bytes)")
    n = int(float(m.group(1)) * _UNITS[unit])
    if n <= 0:
        raise MemoryLimitError(f"{field}: must be positive, got {text!r}")
    return n


#: the disk node's ways of writing and reading its files (:attr:`MemoryLimit.offload_io`)
OFFLOAD_IO = ("buffered", "direct")


@dataclass(frozen=True)
class MemoryLimit:
    """StarPU's main-memory limit in bytes and the directory of its disk node (None: no disk node)."""

    limit_bytes: int
    offload_dir: str | None = None
    #: how the disk node's files are written and read: "buffered" (StarPU's unistd backend, through the page
    #: cache) or "direct" (O_DIRECT for the tiles of whole pages, c/disk_ops.c; docs/memory.md)
    offload_io: str = "buffered"

    def __post_init__(self):
        if self.offload_io not in OFFLOAD_IO:
            raise MemoryLimitError(f"offload_io: {self.offload_io!r} is not one of {', '.join(OFFLOAD_IO)}")

    @property
    def limit_mib(self) -> int:
        """The limit as StarPU takes it (``STARPU_LIMIT_CPU_MEM``, whole MiB, rounded down)."""
        return self.limit_bytes // MIB

    def check(self, graphs, workers: int) -> None:
        """Refuse, in one line, a limit below the smallest working set of ``graphs`` on ``workers``
        workers, and an offload directory that is missing, not writable or too small for what
        may be evicted to it."""
        refused = refusal(graphs, workers, self.limit_bytes, self.offload_dir is not None)
        if refused:
            raise MemoryLimitError(f"memory_limit: {refused}")
        if self.offload_dir is not None:
            check_offload_dir(self.offload_dir, max(tile_bytes(graphs) - self.limit_mib * MIB, 0))
            if self.offload_io == "direct":
                check_direct_io(self.offload_dir)

    def disk_size_bytes(self) -> int:
        """The disk node's capacity given to StarPU: the offload directory's free space, less 64 MiB
        (at least StarPU's minimum, 16 MiB)."""
        return max(shutil.disk_usage(self.offload_dir).free - 64 * MIB, 16 * MIB)


def check_offload_dir(path: str, need: int) -> None:
    """One-line :class:`MemoryLimitError` if ``path`` is missing, not a writable directory, or has less
    than ``need`` bytes free (what may be evicted to it)."""
    if not os.path.exists(path):
        raise MemoryLimitError(f"offload_dir: no such directory {path}")
    if not os.path.isdir(path):
        raise MemoryLimitError(f"offload_dir: {path} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=path, prefix=".tilecast-probe-") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise MemoryLimitError(f"offload_dir: cannot write in {path} ({e.strerror or e})") from None
    free = shutil.disk_usage(path).free
    if free < need:
        raise MemoryLimitError(f"offload_dir: {path} has {format_size(free)} free, the run may evict up to "
                               f"{format_size(need)} to it")


def check_direct_io(path: str) -> None:
    """One-line :class:`MemoryLimitError` if a file in ``path`` cannot be written and read with ``O_DIRECT``
    (``offload_io="direct"``; some file systems refuse it)."""
    import mmap

    fd = -1
    try:
        if not hasattr(os, "O_DIRECT"):
            raise OSError("this system has no O_DIRECT")
        with tempfile.NamedTemporaryFile(dir=path, prefix=".tilecast-direct-") as f:
            fd = os.open(f.name, os.O_RDWR | os.O_DIRECT)
            page = mmap.mmap(-1, mmap.PAGESIZE)  # page-aligned, as O_DIRECT wants
            if os.pwrite(fd, page, 0) != mmap.PAGESIZE or os.preadv(fd, [page], 0) != mmap.PAGESIZE:
                raise OSError("a page did not go through")
    except OSError as e:
        raise MemoryLimitError(f"offload_io: {path} does not take O_DIRECT ({e.strerror or e}); use buffered") from None
    finally:
        if fd >= 0:
            os.close(fd)


def overhead_bytes(graph, before_start_bytes: int, limit_bytes: int) -> int:
    """The resident set a memory-limited process holds beyond the limit: ``before_start_bytes`` (its
    resident set before StarPU starts), StarPU's start, :data:`HANDLE_BYTES` per registered tile of
    ``graph``, and the page glibc puts before each tile buffer it maps (:func:`map_tile_buffers`) for
    as many mapped tiles as the limit holds."""
    nbytes = np.asarray(graph.tile_nbytes)
    mapped = nbytes[nbytes >= MMAP_THRESHOLD_BYTES]
    in_memory = int(limit_bytes // mapped.mean()) if mapped.size else 0
    return (int(before_start_bytes) + STARPU_START_BYTES + graph.n_tiles * HANDLE_BYTES
            + min(in_memory, mapped.size) * PAGE_BYTES)


def proc_status_bytes(field: str) -> int | None:
    """A size line of /proc/self/status (``VmRSS``, ``VmHWM``, ...) in bytes; None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def current_rss_bytes() -> int:
    """The process's resident set size now (``VmRSS`` of /proc/self/status; its peak where there is none)."""
    rss = proc_status_bytes("VmRSS")
    if rss is not None:
        return rss
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# glibc's mallopt parameters (malloc.h).
_M_MMAP_THRESHOLD, _M_MMAP_MAX = -3, -4
MMAP_THRESHOLD_BYTES = 64 * 1024
PAGE_BYTES = 4096  # a mapped block's header takes a page of its own: 256 KiB + 16 B spans 65 pages
MAP_COUNT_MARGIN = 8192  # mappings left to the rest of the process (libraries, threads, Python's arenas)


def map_tile_buffers() -> bool:
    """Have glibc give every allocation of at least :data:`MMAP_THRESHOLD_BYTES` (StarPU's tile buffers)
    its own mapping, returned to the system when StarPU frees the tile. True if it was set.

    By default glibc serves such blocks from its heaps once the first one is freed (its mmap threshold
    rises to the size freed), one heap per thread that allocates, and keeps freed memory there: StarPU
    allocates a tile on the thread that needs it and frees it on the one that evicts it, and tiles differ
    in size, so the freed memory of one heap is not reused for another's tiles. Measured here
    (``tilecast train``, gpt2 sizes with vocab_size 256, batch 1 x 64, tile 256, a 1 GiB limit): peak RSS
    1.76 GiB by default, 1.18 GiB with this setting, rising through the steps in the first case only.
    Setting the threshold also ends glibc's adjustment of it, for the rest of the process. The number of
    such mappings is capped below ``vm.max_map_count`` (beyond the cap, blocks come from the heaps again).
    Not glibc: nothing is done (False)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            max_maps = int(f.read())
    except (OSError, ValueError):
        max_maps = 65530  # the kernel's default
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        libc.mallopt(_M_MMAP_MAX, max(max_maps - MAP_COUNT_MARGIN, 1024)))


