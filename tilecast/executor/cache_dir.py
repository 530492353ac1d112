"""Where tilecast keeps files it can rebuild (the training corpus, ...)."""

from __future__ import annotations

import os


def cache_dir(*parts: str) -> str:
    """``$TILECAST_CACHE_DIR``, else ``$XDG_CACHE_HOME/tilecast``, else ``~/.cache/tilecast``; joined with ``parts``."""
    root = os.environ.get("TILECAST_CACHE_DIR")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(xdg, "tilecast")
    return os.path.join(root, *parts)
