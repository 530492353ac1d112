"""Cache regimes: which cache a kernel shape's buffers fit in, and what a memory-bound kernel costs beyond them.

A memory-bound kernel (few flops per byte: AdamW, the elementwise and
row-wise kernels) runs at the bandwidth of the cache its buffers fit in; when
they outgrow the last level, its rate per byte falls to the memory's. A shape
model extrapolating such a kernel from timed shapes that all fit in a cache
carries their rate beyond it and predicts large shapes too fast
(docs/predicting.md measured AdamW 38-52% off that way).

The regimes are bounded by the machine's caches, as working sets (the bytes
of a shape's buffers): the level-2 cache per core, then the last-level cache
(:func:`tilecast.perfmodel.cache_size.last_level`) shared by the lanes that
timed the shapes side by side. A shape lies in regime 0 (fits the level-2
cache), 1 (fits the last level), or 2 (memory). The shape model
(:class:`tilecast.perfmodel.shape_model.ShapeModel`) uses them when it
extrapolates a memory-bound kernel to larger shapes: the correction comes
from the timed shapes of the predicted shape's own regime; where none was
timed there, from those of the highest regime below it, and a shape beyond
the last level then takes no less than its bytes at the machine's measured
memory bandwidth (a roofline's memory term), in full from :data:`CLEAR_OF_CACHE`
times the last level on (the cliff is not sharp: a working set just past the
cache still streams mostly from it).

Kernels whose bytes formula is only an upper bound of what they touch (the
sparse gathers and scatters: embedding rows, target logits; registry,
:func:`tilecast.kernels.registry.access_bytes`) are not memory-bound by their
buffers' size and are left out.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from tilecast.kernels import all_kernels
from tilecast.perfmodel.shapes import shape_bytes, shape_flops

# Working sets this many times the last-level cache's share stream from memory: between 1 and this, the memory
# floor comes in by log2 of the excess. On the 2-core AMD EPYC (32 MiB, loaded by other work) AdamW ran at 0.7x its
# in-cache rate per byte with 32 MiB of buffers and 0.15x at 64 MiB in one run, 0.13x at 32 MiB in another;
# SwiGLU's 32.2 MiB shapes of llama2-7b at its in-cache rate.
CLEAR_OF_CACHE = 2.0
# Kernels that touch a few rows of a buffer whose whole size their bytes formula counts.
SPARSE_KERNELS = frozenset({"embed", "embed_bwd", "ce_target"})


def working_set(kernel_id: int, shapes: np.ndarray) -> np.ndarray:
    """Bytes of each shape's buffers (each counted once, whatever its access mode)."""
    shapes = np.atleast_2d(np.asarray(shapes, dtype=np.float64))
    return shapes[:, len(all_kernels()[kernel_id].params):].sum(axis=1)


@dataclass(frozen=True)
class CacheRegimes:
    """Working-set bounds of the cache regimes and the memory's rate beyond the last one."""

    bounds: tuple  # ascending bytes at which a regime ends (level-2 cache per core, the last level's share)
    memory_bps: float = 0.0  # bytes moved per second from memory, one core (0: unknown)
    balance: float = 0.0  # flops per byte below which a shape is memory-bound (0: unknown, none is taken for one)

    def regime(self, nbytes) -> np.ndarray:
        """0 for a working set within the first bound, 1 within the second, ... ``len(bounds)`` beyond all."""
        return np.searchsorted(np.asarray(self.bounds, dtype=np.float64), np.asarray(nbytes, dtype=np.float64),
                               side="left")

    @property
    def memory(self) -> int:
        """The regime beyond the last cache."""
        return len(self.bounds)

    def clear_of_cache(self, nbytes) -> np.ndarray:
        """Which working sets stream from memory whatever else the cache holds (:data:`CLEAR_OF_CACHE`)."""
        return np.asarray(nbytes, dtype=np.float64) > CLEAR_OF_CACHE * float(self.bounds[-1] if self.bounds else 0)

    def memory_seconds(self, nbytes_moved, working) -> np.ndarray:
        """The memory floor of shapes moving ``nbytes_moved`` over working sets ``working``: the bytes at the
        memory bandwidth, from nothing at the last cache to whole at :data:`CLEAR_OF_CACHE` times it."""
        if self.memory_bps <= 0 or not self.bounds:
            return np.zeros(np.shape(nbytes_moved))
        excess = np.log2(np.maximum(np.asarray(working, dtype=np.float64), 1.0) / float(self.bounds[-1]))
        share = np.clip(excess / np.log2(CLEAR_OF_CACHE), 0.0, 1.0)
        return share * np.asarray(nbytes_moved, dtype=np.float64) / self.memory_bps

    def memory_bound(self, kernel_id: int, shapes: np.ndarray) -> np.ndarray:
        """Which shapes run at the rate of the memory they stream from: fewer flops per byte moved than the
        machine's balance (none where it is unknown), and not a sparse kernel (:data:`SPARSE_KERNELS`)."""
        shapes = np.atleast_2d(np.asarray(shapes, dtype=np.float64))
        k = all_kernels()[kernel_id]
        if k.name in SPARSE_KERNELS or self.balance <= 0:
            return np.zeros(len(shapes), dtype=bool)
        n = len(k.params)
        flops = shape_flops(kernel_id, shapes[:, :n])
        nbytes = shape_bytes(kernel_id, shapes[:, n:])
        return flops < self.balance * np.maximum(nbytes, 1.0)


@functools.lru_cache(maxsize=1)
def _sysfs() -> tuple:
    """(:func:`~tilecast.perfmodel.cache_size.l2_per_core`, :func:`~tilecast.perfmodel.cache_size.last_level`) of
    this machine, read once a process: every prediction asks (the files do not change while it runs)."""
    from tilecast.perfmodel.cache_size import l2_per_core, last_level

    return l2_per_core(), last_level()


def machine_regimes(kind, calibration=None, lanes: int | None = None) -> CacheRegimes:
    """The regimes of a worker kind (a :class:`tilecast.perfmodel.machine.WorkerKind`) whose shapes
    ``calibration`` timed: its level-2 cache per core (the kind's, else the calibration's, else this machine's),
    this machine's last-level cache over the lanes that shared it while timing (``lanes``, default the
    calibration's busy workers; at most the CPUs sharing it), the kind's memory bandwidth and its balance of
    peak flops to it."""
    l2 = float(kind.cache_bytes or (calibration.cache_bytes if calibration is not None else 0) or _sysfs()[0][0])
    llc, sharing, _ = _sysfs()[1]
    if lanes is None:
        lanes = int(getattr(calibration, "lane_workers", 0) or 1)
    lanes = max(1, min(int(lanes), sharing))
    bounds = tuple(sorted({b for b in (l2, llc / lanes) if b > 0}))
    bw = float(kind.memory_bandwidth * kind.memory_efficiency)
    peak = float(kind.peak_flops * kind.compute_efficiency)
    return CacheRegimes(bounds, bw, peak / bw if bw > 0 and peak > 0 else 0.0)
