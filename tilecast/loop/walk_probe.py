"""StarPU's time per tile its search for a tile to reuse walks past, timed on StarPU alone.

Under a memory limit, an allocation in main memory that finds no room first
searches main memory's list of tiles, from its least recently used end, for a
clean tile of the same size whose memory it can take (StarPU 1.3.10,
``memalloc.c``, ``try_to_reuse_potentially_in_use_mc``), and passes over the
dirty ones. Counted inside StarPU (``benchmarks/starpu_walk.py``), those
searches walk past hundreds to thousands of tiles on average, at 70-100 ns a
tile, several seconds of a large step's worker time (docs/memory.md). The probe
steps that fit StarPU's other costs (:mod:`tilecast.loop.disk_fit`) hold a few
hundred tiles: their walks are too short to show that cost.

:func:`measure_walk_tile_s` makes every search as long as the list by
construction: with StarPU's tidying off (``STARPU_MINIMUM_CLEAN_BUFFERS`` and
``STARPU_TARGET_CLEAN_BUFFERS`` at 0) every tile the host writes stays dirty, so
once main memory is full, each new tile's search walks past all the tiles held,
finds none to reuse, and StarPU evicts the least recently used one to the disk
node. The tiles alternate between two sizes, so that half of those walked past
are of the wanted size, about as in a training step (45-55% there). Timing the
host's writes of tiles past the limit with two limits, the difference of the
median times over the difference of the tiles held is the cost per tile walked
(the eviction and the copy are the same in both).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

#: the two tile sizes, alternating (float32 32 x 32 and 32 x 64)
TILE_BYTES = (4096, 8192)
#: tiles main memory holds in the two sessions, and tiles written past the limit in each (timed one by one)
HELD = (512, 16384)
WRITES = 160
#: times the two sessions are run; the median of their per-tile figures is kept
REPEATS = 3


@dataclass(frozen=True)
class WalkTiming:
    """The walk's cost per tile and what it was measured from."""

    walk_tile_s: float
    held: tuple  # tiles main memory held in each session
    write_s: tuple  # median seconds of two host writes past the limit (one search) in each session
    source: str


def _session_writes(directory: str, held: int, writes: int) -> float:
    """Median seconds of two consecutive host writes of tiles past the limit (one search among them), with ``held``
    tiles in main memory."""
    from tilecast.executor.managed_tiles import ManagedTileStore
    from tilecast.executor.memory_limit import MemoryLimit
    from tilecast.executor.starpu_session import StarPUSession, environment
    from tilecast.graph import GraphBuilder, Tiling

    per_pair = sum(TILE_BYTES)
    limit = -(-held * per_pair // 2 // 2**20) * 2**20  # whole MiB, as StarPU takes the limit
    pairs = (limit // per_pair) + writes // 2 + 2
    b = GraphBuilder(Tiling.uniform(32))
    b.tensor("small", (pairs * 32, TILE_BYTES[0] // 128), ("seq", None), "param")
    b.tensor("large", (pairs * 32, TILE_BYTES[1] // 128), ("seq", None), "param")
    graph = b.build()
    order = np.stack([np.arange(pairs), np.arange(pairs) + pairs], axis=1).reshape(-1)  # small, large, ...
    data = [np.ones(graph.tile_nbytes[t] // 4, np.float32) for t in order[:2]]
    untidied = environment({"STARPU_MINIMUM_CLEAN_BUFFERS": "0", "STARPU_TARGET_CLEAN_BUFFERS": "0"})
    with untidied, StarPUSession("eager", 1, memory=MemoryLimit(limit, directory)) as session:
        store = ManagedTileStore(graph, session)
        fill = int(limit // per_pair) * 2
        for t in order[:fill]:
            store.write_tiles([t], [data[int(t >= pairs)]])
        times = []
        for t in order[fill:fill + writes]:
            t0 = time.perf_counter()
            store.write_tiles([t], [data[int(t >= pairs)]])
            times.append(time.perf_counter() - t0)
        store.close()
    # StarPU reclaims two tiles' room for each tile it cannot place (memalloc.c, _starpu_allocate_interface:
    # starpu_memstrategy_data_size_coefficient), so every other write searches: one search per pair of writes
    pairs_s = np.add(times[0::2][:len(times) // 2], times[1::2][:len(times) // 2])
    return float(np.median(pairs_s))


def measure_walk_tile_s(directory: str, held=HELD, writes: int = WRITES, repeats: int = REPEATS) -> WalkTiming:
    """The cost per tile walked past in StarPU's search for a tile to reuse (s), from pairs of sessions on StarPU
    with a disk node in ``directory`` (see the module's docstring), ``repeats`` times, the median kept; a few
    seconds."""
    runs = [[_session_writes(directory, h, writes) for h in held] for _ in range(max(repeats, 1))]
    per = [(b - a) / (held[1] - held[0]) for a, b in runs]
    k = int(np.argsort(per)[len(per) // 2])
    t, per_tile = runs[k], max(per[k], 0.0)
    source = (f"measured: tilecast calibrate, StarPU alone with its tidying off, host writes past a limit holding "
              f"{held[0]} and {held[1]} tiles of {TILE_BYTES[0] // 1024} and {TILE_BYTES[1] // 1024} KiB: median "
              f"{t[0] * 1e6:.0f} and {t[1] * 1e6:.0f} us a pair of writes (one search)")
    return WalkTiming(per_tile, tuple(held), tuple(t), source)
