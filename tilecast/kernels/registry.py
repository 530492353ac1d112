"""The kernel registry: every kernel tilecast knows is defined here exactly once.

A kernel is a name, its buffers (each with a default access mode), its scalar
parameters (always carrying every shape the kernel needs, so that C code and
cost formulas never have to look at tiles), a vectorised flops formula and a
reference implementation written against an array module ``xp`` (numpy here,
cupy on a GPU).

Buffers reach a reference implementation as flat 1-D arrays, exactly as a
StarPU codelet sees them: one contiguous buffer per tile.
"""

from __future__ import annotations

import functools
from collections import namedtuple
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

# Access modes, as bit flags: bit 0 = read, bit 1 = write.
R, W, RW = 1, 2, 3
MODE_NAMES = {R: "R", W: "W", RW: "RW"}
MODE_CODES = {"R": R, "W": W, "RW": RW}


@dataclass(frozen=True)
class Kernel:
    """One tile kernel.

    ``flops(p)`` receives a dict of parameter name -> numpy array (one entry per
    task) and returns the floating-point operations of each task.
    ``reference(xp, bufs, p)`` executes one task in place on flat buffers, with
    ``p`` a namedtuple of the scalar parameters.
    """

    name: str
    buffers: tuple[str, ...]
    modes: tuple[int, ...]
    params: tuple[str, ...]
    flops: Callable[[dict], np.ndarray]
    reference: Callable
    doc: str = ""
    id: int = -1
    param_type: type = field(default=None, compare=False, repr=False)

    def bytes(self, nbytes: np.ndarray, modes: np.ndarray | None = None) -> np.ndarray:
        """Bytes moved by tasks whose buffers have sizes ``nbytes`` (n_tasks x n_buffers).

        ``modes`` gives each access's mode (default: the registry's); see :func:`access_bytes`.
        """
        nbytes = np.atleast_2d(np.asarray(nbytes, dtype=np.float64))
        if modes is None:  # the registry's modes: one weight per buffer (byte counts: exact in any order)
            return (nbytes * self._mode_weights).sum(axis=1)
        return access_bytes(nbytes, modes).sum(axis=1)

    @functools.cached_property
    def _mode_weights(self) -> np.ndarray:
        """:func:`access_bytes`'s factor per buffer under the registry's modes (1 or 2)."""
        return access_bytes(np.ones(len(self.modes)), np.asarray(self.modes, dtype=np.int8))

    def unpack(self, values) -> tuple:
        """Turn a task's parameter vector into a namedtuple of Python floats."""
        return self.param_type._make(float(v) for v in values)


def access_bytes(nbytes, modes):
    """The bytes formula of every kernel: each buffer's size once per direction.

    A read-only or write-only buffer moves its size once, a read-write buffer
    twice. Kernels touch whole tiles, so this is exact for all but the sparse
    gathers (embedding rows, target logits), where it is an upper bound.
    """
    modes = np.asarray(modes)
    return nbytes * ((modes & 1) + ((modes >> 1) & 1))


KERNELS: dict[str, Kernel] = {}
KERNEL_LIST: list[Kernel] = []


def kernel(name: str, buffers: str, params: str, flops: Callable[[dict], np.ndarray]):
    """Decorator registering a reference implementation as a kernel.

    ``buffers`` is a space-separated list of ``name:MODE`` (MODE in R, W, RW);
    ``params`` a space-separated list of scalar parameter names.
    """

    def register(ref):
        if name in KERNELS:
            raise ValueError(f"kernel {name!r} registered twice")
        bufs = tuple(b.split(":")[0] for b in buffers.split())
        modes = tuple(MODE_CODES[b.split(":")[1]] for b in buffers.split())
        pnames = tuple(params.split())
        k = Kernel(
            name=name,
            buffers=bufs,
            modes=modes,
            params=pnames,
            flops=flops,
            reference=ref,
            doc=(ref.__doc__ or "").strip(),
            id=len(KERNEL_LIST),
            param_type=namedtuple(f"{name}_params", pnames),
        )
        KERNELS[name] = k
        KERNEL_LIST.append(k)
        return ref

    return register


def get(name: str) -> Kernel:
    _load()
    try:
        return KERNELS[name]
    except KeyError:
        raise KeyError(f"unknown kernel {name!r}; known: {', '.join(sorted(KERNELS))}") from None


def all_kernels() -> list[Kernel]:
    _load()
    return list(KERNEL_LIST)


_LOADED = False


def _load() -> None:
    # Importing the definition modules registers their kernels (once: all_kernels is called per shape).
    global _LOADED
    if _LOADED:
        return
    from tilecast.kernels import definitions  # noqa: F401

    _LOADED = True
