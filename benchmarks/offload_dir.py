"""The disk node's directory of a memory-limited benchmark: the one given (``--offload-dir``), or a new one under
``$TILECAST_HOME/offload`` removed at the end."""

from __future__ import annotations

import contextlib
import shutil
import tempfile

from tilecast.home import home


@contextlib.contextmanager
def offload_directory(given: str | None, prefix: str):
    """Yield ``given``, or a new directory (``prefix`` + a unique name) under ``$TILECAST_HOME/offload`` that is
    removed on leaving, whatever happened inside."""
    if given is not None:
        yield given
        return
    base = home("offload")
    base.mkdir(parents=True, exist_ok=True)
    made = tempfile.mkdtemp(prefix=prefix, dir=base)
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)
