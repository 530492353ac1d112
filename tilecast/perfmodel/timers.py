"""Timing functions that calibration runs kernels with.

A timer has the signature ``timer(kernel_id, params, buffers, repeats) -> seconds``
(a float array of ``repeats`` durations). ``params`` is the kernel's float64
parameter vector and ``buffers`` one flat numpy array per kernel buffer, as a
StarPU codelet receives them. Calibration does not care what runs the kernel:
the C kernels StarPU executes (:func:`c_kernel_timer`, preferred) or the numpy
references (:func:`numpy_reference_timer`, always available).
"""

from __future__ import annotations

import contextlib
import sys
import time

import numpy as np

from tilecast.kernels import all_kernels

INT_BUFFERS = ("ids", "targets")  # int64 buffers in the registry; every other buffer is float32
#: float32 values drawn at most per buffer; a larger buffer repeats them (a calibration of gigabyte tensors fills
#: tens of gigabytes of lanes: drawn whole in float64 and cast, 4.4 s a gigabyte on a 2-core Xeon, 0.2 s this way)
RANDOM_BLOCK = 1 << 20


def make_buffers(kernel_id: int, nbytes, seed: int = 0) -> list[np.ndarray]:
    """Flat buffers of the given byte sizes with harmless contents (indices 0, small floats)."""
    k = all_kernels()[kernel_id]
    rng = np.random.default_rng(seed)
    out = []
    for name, n in zip(k.buffers, nbytes):
        if name in INT_BUFFERS:
            out.append(np.zeros(int(n) // 8, dtype=np.int64))
        else:
            size = int(n) // 4
            block = rng.random(min(size, RANDOM_BLOCK), dtype=np.float32)
            block *= 0.01
            out.append(block if size <= RANDOM_BLOCK else np.resize(block, size))
    return out


def numpy_reference_timer(kernel_id: int, params: np.ndarray, buffers: list, repeats: int) -> np.ndarray:
    """Time the numpy reference kernel on one BLAS thread (after one warm-up run)."""
    from threadpoolctl import threadpool_limits

    k = all_kernels()[kernel_id]
    p = k.unpack(params)
    out = np.empty(repeats)
    with threadpool_limits(1, user_api="blas"), np.errstate(all="ignore"):
        k.reference(np, buffers, p)
        for i in range(repeats):
            t0 = time.perf_counter()
            k.reference(np, buffers, p)
            out[i] = time.perf_counter() - t0
    return out


def c_kernel_timer():
    """The timer of the native C kernels (the code StarPU's CPU workers run), or None if they cannot be built."""
    try:
        from tilecast.kernels import native

        with contextlib.redirect_stdout(sys.stderr):  # a first build reports to stdout; keep --json clean
            native.library()
    except Exception:  # no compiler, no OpenBLAS, or an older tree without the C kernels
        return None

    def time_c(kernel_id: int, params: np.ndarray, buffers: list, repeats: int) -> np.ndarray:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(1, user_api="blas"):
            return native.time_kernel(kernel_id, params, buffers, repeats + 1)[1:]  # first run warms up

    return time_c


def default_timer():
    """(name, timer): the C kernels when built, else the numpy references."""
    c = c_kernel_timer()
    if c is not None:
        return "c-kernels", c
    return "numpy-reference", numpy_reference_timer
