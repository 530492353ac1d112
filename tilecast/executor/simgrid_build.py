"""StarPU 1.3.10 built in SimGrid mode, and the replay program linked against it.

Debian's StarPU has no SimGrid support, so :func:`ensure_starpu_simgrid`
builds StarPU from its source tree (Debian's source package, ``apt-get source
starpu``; pass the unpacked directory or set ``$TILECAST_STARPU_SRC``) with
``--enable-simgrid`` against ``libsimgrid-dev``, out of tree, into
``$TILECAST_HOME/starpu-simgrid``. A finished build leaves a stamp with its
configure flags; a prefix with a matching stamp is reused, anything else is
removed and built again (about five minutes on two cores). A file lock keeps
two processes from building at once; configure and make output goes to
``build.log`` beside the prefix.

:func:`ensure_replay` compiles ``c/simgrid_replay.c`` (the program that
submits an exported graph, see :mod:`tilecast.executor.simgrid_replay`)
against that prefix, cached by source and stamp.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tilecast.home import home
from tilecast.kernels.native_build import NativeUnavailable

C_DIR = Path(__file__).parent / "c"
STARPU_VERSION = "1.3.10"
CONFIGURE_FLAGS = [
    "--enable-simgrid", "--disable-cuda", "--disable-opencl", "--disable-mpi", "--disable-fortran",
    "--disable-build-examples", "--disable-build-tests", "--disable-build-doc", "--disable-starpufft",
    "--disable-glpk",
]
STAMP = ".tilecast-stamp"


def simgrid_prefix() -> Path:
    return home("starpu-simgrid")


def _stamp_text() -> str:
    return f"starpu {STARPU_VERSION}\n" + " ".join(CONFIGURE_FLAGS) + "\n"


def simgrid_built() -> bool:
    """Whether a finished SimGrid build of StarPU is in the prefix (no build is started)."""
    stamp = simgrid_prefix() / STAMP
    return stamp.is_file() and stamp.read_text() == _stamp_text()


def _say(msg: str) -> None:
    print(f"tilecast: {msg}", file=sys.stderr, flush=True)


def _check_tools() -> None:
    missing = [t for t in ("cc", "c++", "make", "pkg-config") if not shutil.which(t)]
    if missing:
        raise NativeUnavailable(f"building StarPU with SimGrid needs {', '.join(missing)} "
                                f"(install: apt-get install build-essential pkg-config)")
    for pkg, deb in (("simgrid", "libsimgrid-dev"), ("hwloc", "libhwloc-dev")):
        if subprocess.run(["pkg-config", "--exists", pkg]).returncode != 0:
            raise NativeUnavailable(f"building StarPU with SimGrid needs {pkg} (install: apt-get install {deb})")


def starpu_source_dir(source) -> Path:
    """The unpacked StarPU 1.3.10 source tree: ``source``, else ``$TILECAST_STARPU_SRC``; NativeUnavailable if it is
    missing or another version."""
    src = source or os.environ.get("TILECAST_STARPU_SRC")
    if not src:
        raise NativeUnavailable(
            "StarPU's sources are needed to build it (with SimGrid, or with walk counters): run "
            "`apt-get source starpu` (StarPU 1.3.10, Debian bookworm) and set TILECAST_STARPU_SRC to the unpacked "
            "directory")
    src = Path(src)
    configure_ac = src / "configure.ac"
    if not (src / "configure").is_file() or not configure_ac.is_file():
        raise NativeUnavailable(f"{src}: not a StarPU source tree (no configure or configure.ac)")
    m = re.search(r"AC_INIT\(\[StarPU\],\s*\[([^\]]+)\]", configure_ac.read_text(errors="replace"))
    found = m.group(1) if m else "of unknown version"
    if found != STARPU_VERSION:
        raise NativeUnavailable(f"{src}: StarPU {found}, expected {STARPU_VERSION} "
                                f"(the version tilecast's policies and Debian's runtime follow)")
    return src


@contextlib.contextmanager
def build_lock(path: Path):
    """An exclusive file lock held while one process builds (others wait, then find the build done)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_logged(cmd, cwd: Path, log: Path, what: str, label: str = "StarPU SimGrid build") -> None:
    """Run ``cmd`` in ``cwd``, its output appended to ``log``; NativeUnavailable naming ``label``, ``what`` and the
    log's last lines if it fails."""
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(map(str, cmd))}\n")
        out.flush()
        res = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    if res.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise NativeUnavailable(f"{label}: {what} failed (log: {log}):\n" + "\n".join(tail))


def ensure_starpu_simgrid(source=None, jobs: int | None = None) -> Path:
    """The prefix of StarPU built with SimGrid, building it first if needed (minutes)."""
    prefix = simgrid_prefix()
    if simgrid_built():
        return prefix
    with build_lock(prefix.parent / "starpu-simgrid.lock"):
        if simgrid_built():
            return prefix
        src = starpu_source_dir(source)
        _check_tools()
        build = prefix.parent / "starpu-simgrid-build"
        log = prefix.parent / "starpu-simgrid-build.log"
        for d in (build, prefix):
            shutil.rmtree(d, ignore_errors=True)
        build.mkdir(parents=True)
        log.write_text("")
        jobs = jobs or os.cpu_count() or 1
        _say(f"building StarPU {STARPU_VERSION} with SimGrid into {prefix} (several minutes; log: {log})")
        _say("  configure")
        run_logged([str(src / "configure"), f"--prefix={prefix}"] + CONFIGURE_FLAGS, build, log, "configure")
        _say(f"  make -j{jobs}")
        run_logged(["make", f"-j{jobs}"], build, log, "make")
        _say("  make install")
        run_logged(["make", "install"], build, log, "make install")
        (prefix / STAMP).write_text(_stamp_text())
        shutil.rmtree(build, ignore_errors=True)
        _say("StarPU with SimGrid built")
    return prefix


def pkg_config_flags(prefix: Path) -> list[str]:
    env = dict(os.environ, PKG_CONFIG_PATH=str(prefix / "lib" / "pkgconfig"))
    res = subprocess.run(["pkg-config", "--cflags", "--libs", "starpu-1.3"], capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise NativeUnavailable(f"pkg-config cannot find starpu-1.3 in {prefix}: {res.stderr.strip()}")
    return res.stdout.split()


def compile_replay(out: Path, flags: list[str], parse_only: bool = False) -> Path:
    """Compile ``simgrid_replay.c`` into ``out``: against StarPU (``flags`` from pkg-config), or, with
    ``parse_only``, without StarPU (the program then only reads a graph and prints its summary)."""
    src = C_DIR / "simgrid_replay.c"
    cmd = ["cc", "-O2", "-std=gnu11", "-Wall", "-o", str(out), str(src)]
    cmd += ["-DTCS_PARSE_ONLY"] if parse_only else flags + [f"-Wl,-rpath,{f[2:]}" for f in flags if f.startswith("-L")]
    if not shutil.which("cc"):
        raise NativeUnavailable("compiling the replay program needs a C compiler (install: apt-get install gcc)")
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise NativeUnavailable(f"compiling {src.name} failed:\n{res.stderr.strip()}")
    return out


def ensure_replay(source=None) -> Path:
    """The replay program linked against StarPU-with-SimGrid (StarPU and the program built if needed)."""
    prefix = ensure_starpu_simgrid(source)
    flags = pkg_config_flags(prefix)
    key = hashlib.sha256(((C_DIR / "simgrid_replay.c").read_bytes() + _stamp_text().encode()
                          + " ".join(flags).encode())).hexdigest()[:16]
    exe = prefix / "bin" / f"tilecast-simgrid-replay-{key}"
    if not exe.is_file():
        tmp = exe.with_name(f".{exe.name}.{os.getpid()}.tmp")  # concurrent builds never share it
        compile_replay(tmp, flags)
        os.replace(tmp, exe)
    return exe
