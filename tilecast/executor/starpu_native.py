"""Build and load the StarPU glue extension (``tilecast/executor/c``).

Linked against whatever ``pkg-config`` finds for StarPU (``starpu-1.3`` on
Debian bookworm; ``$TILECAST_STARPU_PKG`` names another package). A machine
without StarPU still imports tilecast; only this module's :func:`glue` raises
:class:`~tilecast.kernels.native_build.NativeUnavailable` with what to install.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from tilecast.kernels.native_build import NativeUnavailable, build_extension

C_DIR = Path(__file__).parent / "c"
INSTALL_HINT = "apt-get install libstarpu-dev"


def starpu_package() -> str:
    return os.environ.get("TILECAST_STARPU_PKG", "starpu-1.3")


def _pkg_config(pkg: str, what: str) -> list[str]:
    if not shutil.which("pkg-config"):
        raise NativeUnavailable(f"StarPU not found: pkg-config is missing (install: apt-get install pkg-config "
                                f"{INSTALL_HINT.split(' ', 2)[2]})")
    res = subprocess.run(["pkg-config", what, pkg], capture_output=True, text=True)
    if res.returncode != 0:
        raise NativeUnavailable(f"StarPU not found (pkg-config {pkg}); to execute graphs, install: {INSTALL_HINT}")
    return shlex.split(res.stdout)


def _cdef() -> str:
    """The glue header, minus preprocessor lines, as cffi declarations."""
    lines = (C_DIR / "starpu_glue.h").read_text().splitlines()
    keep = [ln for ln in lines if not ln.startswith("#")]
    return "\n".join(keep) + "\n#define TCS_DRY 1\n#define TCS_SUBMIT_PAUSED 2\n"


_GLUE = []


def glue():
    """The compiled glue module (``.ffi``, ``.lib``), built on first use."""
    if _GLUE:
        return _GLUE[0]
    pkg = starpu_package()
    cflags = _pkg_config(pkg, "--cflags")
    libs = _pkg_config(pkg, "--libs")
    mod = build_extension(
        "_tilecast_starpu", _cdef(), '#include "starpu_glue.h"',
        sources=[str(C_DIR / "starpu_glue.c"), str(C_DIR / "disk_ops.c")],
        include_dirs=[str(C_DIR)] + [f[2:] for f in cflags if f.startswith("-I")],
        libraries=[f[2:] for f in libs if f.startswith("-l")],
        library_dirs=[f[2:] for f in libs if f.startswith("-L")],
        extra_compile_args=["-O2", "-std=gnu11"] + [f for f in cflags if not f.startswith("-I")],
        extra_link_args=[f for f in libs if not f.startswith(("-l", "-L"))],
        hint=INSTALL_HINT,
    )
    _GLUE.append(mod)
    return mod
