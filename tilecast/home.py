"""tilecast's home: the one directory for its caches and runtime files.

``$TILECAST_HOME``, else ``$XDG_CACHE_HOME/tilecast``, else ``~/.cache/tilecast``.
Everything tilecast keeps between runs lives under it: ``native/`` (compiled
kernels and extensions), ``calibration/`` (kernel models, host-cost fits),
``machines/`` (the detected local machine), ``starpu/`` (StarPU's own files) and
``corpus/`` (the training corpus). Every package may import this module; it
imports nothing of tilecast.
"""

from __future__ import annotations

import os
from pathlib import Path


def home(*parts: str) -> Path:
    """tilecast's home directory (see the module doc), joined with ``parts``; not created."""
    root = os.environ.get("TILECAST_HOME")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(xdg, "tilecast")
    return Path(root).joinpath(*parts)
