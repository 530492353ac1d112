"""Writing a file so that readers see either the old or the complete new version.

The content goes to a temporary file in the destination's directory, is flushed
and fsync'ed, then renamed over the destination (``os.replace`` is atomic on
POSIX within one file system), and the directory is fsync'ed so the rename
itself survives a crash. An interrupted write (error, Ctrl-C) leaves the old
file untouched and removes the temporary one. The temporary file's name is
unique, so concurrent writers of one path never share it: the last complete
write wins. Every file tilecast keeps between runs is written through
:func:`atomic_write`; every package may import this module.
"""

from __future__ import annotations

import contextlib
import os
import tempfile


@contextlib.contextmanager
def atomic_write(path, mode: str = "wb"):
    """``with atomic_write(path) as f: f.write(...)`` replaces ``path`` only once ``f`` is complete.

    ``mode`` is ``"wb"`` or ``"w"`` (text); the directory is created if missing."""
    if mode not in ("wb", "w"):
        raise ValueError(f"mode must be 'wb' or 'w', got {mode!r}")
    path = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual mode
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(folder)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_dir(folder: str) -> None:
    try:
        dfd = os.open(folder, os.O_RDONLY)
    except OSError:  # some file systems do not open directories
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
