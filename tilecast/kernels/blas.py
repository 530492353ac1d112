"""The BLAS that the C kernels link, and which of its kernels runs on this CPU.

The C kernels (GEMM, attention products) link OpenBLAS from the
``scipy-openblas32`` wheel, not the system's ``libopenblas``:

- it picks its kernels at load time from the CPU's features (``DYNAMIC_ARCH``)
  with a current table of CPUs; Debian bookworm's OpenBLAS 0.3.21 (2022) does
  not know some newer CPUs and falls back to its Prescott (SSE3) kernels on
  them, 3-5x slower for SGEMM on an AVX-512 machine;
- it is the same version on every machine (pip installs it), so kernel
  calibrations of two machines differ by their CPUs, not by their distribution;
- its symbols carry a ``scipy_`` prefix, so it lives in one process beside
  numpy's and any system OpenBLAS without either taking the other's symbols.

Which kernel set ("core") the library chose is read from the library itself
(``openblas_get_corename``). A core that uses fewer vector extensions than the
CPU offers (e.g. Prescott on an AVX2 or AVX-512 CPU) is a fallback: it is
reported in one warning line, since every time that tilecast measures or
predicts depends on it. ``OPENBLAS_CORETYPE`` in the environment forces a core
(OpenBLAS reads it at load time); tilecast never sets it.
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass

from tilecast.kernels.native_build import NativeUnavailable

PACKAGE = "scipy_openblas32"
INSTALL_HINT = "pip install scipy-openblas32"

# OpenBLAS core names (driver/others/dynamic.c) by the widest vector extension their SGEMM kernels use.
_CORE_ISA = {
    **dict.fromkeys(["skylakex", "cooperlake", "sapphirerapids"], "avx512"),
    **dict.fromkeys(["haswell", "zen", "excavator", "steamroller", "piledriver"], "avx2"),
    **dict.fromkeys(["sandybridge", "bulldozer"], "avx"),
}
_ISA_RANK = {"sse": 0, "avx": 1, "avx2": 2, "avx512": 3}


@dataclass(frozen=True)
class BlasInfo:
    """The linked BLAS: library, version, the core it runs, and whether that core is a fallback."""

    library: str
    version: str
    core: str
    config: str
    cpu_isa: str
    core_isa: str
    forced_core: str | None  # OPENBLAS_CORETYPE, when the environment sets it

    @property
    def fallback(self) -> bool:
        """The core uses fewer vector extensions than this CPU offers."""
        return _ISA_RANK[self.core_isa] < _ISA_RANK[self.cpu_isa]

    def describe(self) -> str:
        """One line for people, e.g. ``OpenBLAS 0.3.34 (scipy-openblas32), core SkylakeX``."""
        return f"OpenBLAS {self.version} ({self.library}), core {self.core}"

    def warning(self) -> str | None:
        """One line when the core is a fallback, else None."""
        if not self.fallback:
            return None
        why = (f"OPENBLAS_CORETYPE={self.forced_core} in the environment forces it" if self.forced_core
               else "OpenBLAS did not recognise this CPU")
        return (f"warning: the C kernels' BLAS runs its {self.core} kernels ({self.core_isa.upper()}) on a CPU with "
                f"{self.cpu_isa.upper()} ({why}); GEMM may run several times slower than this CPU allows")

    def to_dict(self) -> dict:
        return {"library": self.library, "version": self.version, "core": self.core, "config": self.config,
                "cpu_isa": self.cpu_isa, "core_isa": self.core_isa, "fallback": self.fallback,
                "forced_core": self.forced_core}


def _package():
    try:
        import scipy_openblas32
    except ImportError:
        raise NativeUnavailable(f"the C kernels' BLAS is missing (install: {INSTALL_HINT})") from None
    return scipy_openblas32


def build_flags() -> dict:
    """Compiler and linker arguments for code that calls the BLAS (``cffi`` ``set_source`` keywords).

    The library directory is also the run path, so the built extension finds
    the wheel's library wherever it is installed.
    """
    pkg = _package()
    lib_dir = pkg.get_lib_dir()
    return {"include_dirs": [pkg.get_include_dir()], "library_dirs": [lib_dir],
            "libraries": [pkg.get_library()], "extra_link_args": [f"-Wl,-rpath,{lib_dir}"]}


def cpu_isa(flags: set[str] | None = None) -> str:
    """The widest vector extension this CPU offers for float32 GEMM (from /proc/cpuinfo's flags)."""
    if flags is None:
        flags = _cpu_flags()
    if {"avx512f", "avx512vl"} <= flags:
        return "avx512"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    if "avx" in flags:
        return "avx"
    return "sse"


def core_isa(core: str) -> str:
    """The widest vector extension an OpenBLAS core's kernels use (``sse`` for the generic ones)."""
    return _CORE_ISA.get(core.lower(), "sse")


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:  # pragma: no cover - non-Linux
        pass
    return set()


@functools.lru_cache(maxsize=1)
def blas_info() -> BlasInfo:
    """What the C kernels' BLAS is and runs here (loads the library; no build needed)."""
    pkg = _package()
    path = os.path.join(pkg.get_lib_dir(), f"lib{pkg.get_library()}.so")
    try:
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
    except OSError as e:
        raise NativeUnavailable(f"the C kernels' BLAS cannot be loaded ({e}; install: {INSTALL_HINT})") from None
    prefix = pkg.get_library().removesuffix("openblas")  # "scipy_": the wheel's symbol prefix
    corename = getattr(lib, f"{prefix}openblas_get_corename")
    config = getattr(lib, f"{prefix}openblas_get_config")
    corename.restype = config.restype = ctypes.c_char_p
    core = corename().decode()
    version = getattr(pkg, "__version__", "?").split(".")
    return BlasInfo(library=PACKAGE.replace("_", "-"), version=".".join(version[:3]), core=core,
                    config=config().decode().strip(), cpu_isa=cpu_isa(), core_isa=core_isa(core),
                    forced_core=os.environ.get("OPENBLAS_CORETYPE") or None)
