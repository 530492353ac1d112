"""The C kernels (``tilecast/kernels/c``), callable from Python without StarPU.

The same compiled functions run inside StarPU codelets and in calibration
microbenchmarks, so a kernel's cost model is calibrated on the code that runs.
Built automatically on first use (see :mod:`tilecast.kernels.native_build`).
"""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np

from tilecast.kernels import blas
from tilecast.kernels.native_build import NativeUnavailable, build_extension
from tilecast.kernels.registry import Kernel, all_kernels, get

C_DIR = Path(__file__).parent / "c"
C_SOURCES = sorted(str(p) for p in C_DIR.glob("*.c"))
# Buffers holding token ids instead of float32 values.
INT64_BUFFERS = {"ids", "targets"}

CDEF = """
typedef void (*tc_kernel_fn)(const double *p, void *const *buf);
tc_kernel_fn tc_kernel_lookup(const char *name);
int tc_kernel_count(void);
const char *tc_kernel_name(int i);
void tc_init(void);
void tc_run(tc_kernel_fn f, const double *p, void *const *buf);
void tc_time(tc_kernel_fn f, const double *p, void *const *buf, int repeats, double *seconds);
"""

# No -ffast-math: results must follow IEEE float32 like numpy (infinities, NaN, no reassociation, no FMA
# contraction; tc_math.h's exponential asks for its fused multiply-adds explicitly). -fno-trapping-math and -fno-math-errno change no result but let loops with selects and
# floorf/sqrtf vectorise. On x86-64, -mprefer-vector-width=512 lets loops use the full AVX-512 width where
# the CPU has it (GCC's default for such CPUs is 256 bits): the exponential-bound kernels (softmax
# statistics, cross-entropy gradient, GELU) run 8-20% faster; a CPU without AVX-512 ignores it.
COMPILE_ARGS = ["-O3", "-march=native", "-ffp-contract=off", "-fno-trapping-math", "-fno-math-errno", "-std=c11",
                "-D_POSIX_C_SOURCE=200809L"]
if platform.machine().lower() in ("x86_64", "amd64"):
    COMPILE_ARGS.append("-mprefer-vector-width=512")

_FNS: list | None = None


def kernels_fingerprint() -> str:
    """A short hash of the C kernels' sources, headers and compiler flags: what a stored kernel calibration was
    timed with (a change to a kernel's code or flags makes it time differently, so the calibration is made
    again)."""
    from tilecast.kernels.native_build import build_key

    return build_key([p.name.encode() + b"\0" + p.read_bytes() for p in sorted(C_DIR.iterdir())
                      if p.suffix in (".c", ".h")] + COMPILE_ARGS)


def library():
    """The compiled kernels module (``.ffi``, ``.lib``), built on first use."""
    flags = blas.build_flags()
    mod = build_extension(
        "_tilecast_kernels", CDEF, '#include "tilecast_kernels.h"', sources=C_SOURCES,
        include_dirs=[str(C_DIR)] + flags["include_dirs"], libraries=flags["libraries"] + ["m"],
        library_dirs=flags["library_dirs"], extra_link_args=flags["extra_link_args"],
        extra_compile_args=COMPILE_ARGS, hint=blas.INSTALL_HINT,
    )
    global _FNS
    if _FNS is None:
        mod.lib.tc_init()
        fns = []
        for k in all_kernels():
            fn = mod.lib.tc_kernel_lookup(k.name.encode())
            if fn == mod.ffi.NULL:
                raise NativeUnavailable(f"kernel {k.name!r} has no C implementation in {C_DIR}")
            fns.append(fn)
        _FNS = fns
    return mod


def kernel_functions() -> list:
    """C function pointer of every registry kernel, indexed by kernel id."""
    library()
    return list(_FNS)


def kernel_addresses() -> np.ndarray:
    """Addresses of the C kernels by kernel id (for other native extensions)."""
    mod = library()
    return np.array([int(mod.ffi.cast("uintptr_t", f)) for f in _FNS], dtype=np.uint64)


def _resolve(kernel) -> Kernel:
    if isinstance(kernel, Kernel):
        return kernel
    if isinstance(kernel, (int, np.integer)):
        return all_kernels()[int(kernel)]
    return get(kernel)


def _pack(k: Kernel, params, buffers):
    mod = library()
    if isinstance(params, dict):
        params = [params[n] for n in k.params]
    p = np.ascontiguousarray(params, dtype=np.float64)
    if p.shape != (len(k.params),):
        raise ValueError(f"{k.name}: {len(k.params)} parameters expected ({' '.join(k.params)}), got {p.size}")
    if len(buffers) != len(k.buffers):
        raise ValueError(f"{k.name}: {len(k.buffers)} buffers expected, got {len(buffers)}")
    ptrs = mod.ffi.new("void *[]", len(buffers))
    for j, (name, b) in enumerate(zip(k.buffers, buffers)):
        want = np.int64 if name in INT64_BUFFERS else np.float32
        if not isinstance(b, np.ndarray) or b.dtype != want or not b.flags.c_contiguous or not b.flags.writeable:
            raise ValueError(f"{k.name}: buffer {name!r} must be a contiguous, writeable {np.dtype(want)} array")
        ptrs[j] = mod.ffi.cast("void *", b.ctypes.data)
    return mod, p, ptrs


def run_kernel(kernel, params, buffers) -> None:
    """Run one C kernel in place on flat numpy buffers (registry buffer and parameter order)."""
    k = _resolve(kernel)
    mod, p, ptrs = _pack(k, params, buffers)
    mod.lib.tc_run(_FNS[k.id], mod.ffi.from_buffer("double[]", p), ptrs)


def time_kernel(kernel, params, buffers, repeats: int = 10) -> np.ndarray:
    """Run a C kernel ``repeats`` times back to back; seconds of each run.

    Kernels that update buffers in place keep updating them on every repeat.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    k = _resolve(kernel)
    mod, p, ptrs = _pack(k, params, buffers)
    out = np.empty(repeats, dtype=np.float64)
    mod.lib.tc_time(_FNS[k.id], mod.ffi.from_buffer("double[]", p), ptrs, repeats,
                    mod.ffi.from_buffer("double[]", out))
    return out
