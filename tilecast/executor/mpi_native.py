"""Build and load the StarPU-MPI glue: ``c/starpu_glue.c`` (codelets, kernels) and ``c/starpu_mpi_glue.c``
in one extension, linked against StarPU-MPI (``pkg-config starpumpi-1.3``) and Open MPI (``mpicc --showme``).

A machine without them still imports tilecast; :func:`mpi_glue` raises
:class:`~tilecast.kernels.native_build.NativeUnavailable` with what to install.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess

from tilecast.executor.starpu_native import C_DIR, _cdef, _pkg_config
from tilecast.kernels.native_build import NativeUnavailable, build_extension

MPI_HINT = "apt-get install openmpi-bin libopenmpi-dev libstarpu-dev"


def _mpi_flags() -> tuple[list[str], list[str]]:
    """Open MPI's compile and link flags, from its compiler wrapper."""
    mpicc = shutil.which("mpicc")
    if not mpicc:
        raise NativeUnavailable(f"MPI not found: mpicc is missing (install: {MPI_HINT})")
    out = []
    for what in ("--showme:compile", "--showme:link"):
        res = subprocess.run([mpicc, what], capture_output=True, text=True)
        if res.returncode != 0:
            raise NativeUnavailable(f"mpicc {what} failed; an Open MPI mpicc is needed (install: {MPI_HINT})")
        out.append(shlex.split(res.stdout))
    return out[0], out[1]


def _mpi_cdef() -> str:
    lines = (C_DIR / "starpu_mpi_glue.h").read_text().splitlines()
    return "\n".join(ln for ln in lines if not ln.startswith("#")) + "\n"


def mpi_glue():
    """The compiled StarPU-MPI glue module (``.ffi``, ``.lib``), built on first use."""
    try:
        cflags = _pkg_config("starpumpi-1.3", "--cflags")
        libs = _pkg_config("starpumpi-1.3", "--libs")
    except NativeUnavailable:
        raise NativeUnavailable(f"StarPU-MPI not found (pkg-config starpumpi-1.3; install: {MPI_HINT})") from None
    mpi_c, mpi_l = _mpi_flags()
    cflags, libs = cflags + mpi_c, libs + mpi_l
    return build_extension(
        "_tilecast_starpu_mpi", _cdef() + _mpi_cdef(), '#include "starpu_glue.h"\n#include "starpu_mpi_glue.h"',
        sources=[str(C_DIR / "starpu_glue.c"), str(C_DIR / "disk_ops.c"), str(C_DIR / "starpu_mpi_glue.c")],
        include_dirs=[str(C_DIR)] + [f[2:] for f in cflags if f.startswith("-I")],
        libraries=[f[2:] for f in libs if f.startswith("-l")],
        library_dirs=[f[2:] for f in libs if f.startswith("-L")],
        extra_compile_args=["-O2", "-std=gnu11"] + [f for f in cflags if not f.startswith("-I")],
        extra_link_args=[f for f in libs if not f.startswith(("-l", "-L"))],
        hint=MPI_HINT,
    )
