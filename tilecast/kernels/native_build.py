"""Build a native extension once, cache it, and load it.

Extensions are compiled into ``$TILECAST_HOME/native/<name>-<key>/`` (default
home: ``~/.cache/tilecast``), where the key hashes everything that affects the
binary: for the cffi kernels, sources, declarations, flags, Python and cffi
versions, and the CPU (the code is built with ``-march=native``). A file lock
keeps two processes from building the same extension at once; a finished build
is moved into place atomically, so a half-built directory is never loaded.
Compiler output goes to a ``build.log`` beside the build, never to standard
output. :func:`cached_extension` is that cache for any builder (the simulator's
Cython loop uses it too); :func:`build_extension` is the cffi builder.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

from tilecast.home import home

_LOADED: dict[str, object] = {}


class NativeUnavailable(RuntimeError):
    """A native extension cannot be built here; the message says what to install."""


def _cpu_id() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor()


def build_key(parts: list) -> str:
    """A short hash of everything that makes a build what it is (its cache directory's suffix)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(repr(part).encode() if not isinstance(part, bytes) else part)
        h.update(b"\0")
    return h.hexdigest()[:16]


@contextlib.contextmanager
def _redirect_fds(path: Path):
    """Send compiler and setuptools output (file descriptors 1 and 2, sys.stdout/stderr) to a log file."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            # Python-level writers too (setuptools prints through sys.stdout, which may not be fd 1).
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _diagnose(log: Path, hint: str) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    errors = [ln.strip() for ln in text.splitlines() if "error" in ln.lower()]
    first = errors[0] if errors else (text.strip().splitlines() or ["no output"])[-1]
    return f"{first[:200]} (install: {hint}; full log: {log})"


def build_extension(name: str, cdef: str, source: str, *, sources=(), include_dirs=(), libraries=(),
                    library_dirs=(), extra_compile_args=(), extra_link_args=(), hint: str = ""):
    """Return the compiled cffi module ``name`` (with ``.ffi`` and ``.lib``), building it if needed."""
    if name in _LOADED:
        return _LOADED[name]
    try:
        import cffi
    except ImportError:
        raise NativeUnavailable("the cffi Python package is missing (install: pip install cffi)") from None
    sources = [str(Path(s).resolve()) for s in sources]
    flags = dict(include_dirs=list(include_dirs), libraries=list(libraries), library_dirs=list(library_dirs),
                 extra_compile_args=list(extra_compile_args), extra_link_args=list(extra_link_args))
    key = build_key([name, cdef, source, flags, sys.version, cffi.__version__, _cpu_id()]
               + [Path(s).read_bytes() for s in sources]
               + [Path(d, h).read_bytes() for d in include_dirs if Path(d).is_dir()
                  for h in sorted(os.listdir(d)) if h.endswith(".h")])

    def compile_into(tmp: Path) -> None:
        ffi = cffi.FFI()
        ffi.cdef(cdef)
        ffi.set_source(name, source, sources=sources, **flags)
        ffi.compile(tmpdir=str(tmp), verbose=True)

    module = cached_extension(name, key, compile_into, hint)
    _LOADED[name] = module
    return module


def cached_extension(name: str, key: str, compile_into, hint: str = ""):
    """Load extension module ``name`` built under ``key``, first building it with ``compile_into(tmpdir)``.

    ``compile_into`` leaves ``<name>*.so`` in the directory it is given (its
    output goes to the build log); a failure raises :class:`NativeUnavailable`.
    """
    root = home("native")
    target = root / f"{name}-{key}"
    root.mkdir(parents=True, exist_ok=True)
    if not _built(target, name):
        with open(root / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not _built(target, name):
                _compile(name, compile_into, root, target, hint)
    return _load(target, name)


def _built(target: Path, name: str) -> bool:
    return (target / "ok").exists() and any(target.glob(f"{name}*.so"))


def _compile(name, compile_into, root: Path, target: Path, hint: str) -> None:
    if not (shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")):
        raise NativeUnavailable(f"building {name}: no C compiler found (install: apt-get install build-essential)")
    tmp = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
    log = tmp / "build.log"
    try:
        with _redirect_fds(log):
            compile_into(tmp)
        if not any(tmp.glob(f"{name}*.so")):
            raise RuntimeError(f"error: the build left no {name}*.so")
    except Exception as e:
        with open(log, "a") as f:
            f.write(f"\n{type(e).__name__}: {e}\n")
        failed = root / f"{name}-failed.log"
        shutil.copy(log, failed)
        shutil.rmtree(tmp, ignore_errors=True)
        raise NativeUnavailable(f"building {name} failed: {_diagnose(failed, hint)}") from None
    for junk in tmp.iterdir():
        if junk.is_dir():
            shutil.rmtree(junk, ignore_errors=True)
    (tmp / "ok").write_text("")
    if target.exists():
        shutil.rmtree(target)
    os.rename(tmp, target)


def _load(target: Path, name: str):
    path = next(target.glob(f"{name}*.so"))
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
