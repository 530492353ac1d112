"""Training data every machine has offline: the Python standard library's own sources, as bytes.

The corpus is every ``.py`` file under ``sysconfig.get_paths()["stdlib"]``,
in sorted order of their relative paths, except third-party packages
(``site-packages``, ``dist-packages``), test suites (directories named
``test``, ``tests``, ``idle_test``) and the build-specific files
(``_sysconfigdata*`` modules, the ``config-*`` directory). Tokens are bytes (vocabulary 256).

Validation split: whole files, chosen by a hash of their relative path (a file
is held out when the first 32 bits of its SHA-256, over 2**32, fall below the
validation fraction), so the split is the same on every machine with the same
files and no file contributes to both sides.

The concatenated files are cached in tilecast's home (:func:`~tilecast.home.home`, ``$TILECAST_HOME``)
under ``corpus/``, keyed by the Python version and a digest of the file list and sizes.

Batches: :class:`BatchSampler` draws random windows of the training bytes from
a numpy ``Generator`` whose state is saved with a checkpoint, so a resumed run
draws exactly the batches an uninterrupted one would; :func:`validation_batches`
gives the same validation windows every time.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from tilecast.atomic_file import atomic_write
from tilecast.home import home

VOCAB_SIZE = 256
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})
EXCLUDED_PREFIXES = ("_sysconfigdata",)  # paths of the machine that built Python


class DataError(ValueError):
    """Data that cannot be used; one line naming why."""


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def stdlib_files(root: str | None = None) -> list[str]:
    """Relative POSIX paths of the corpus files under ``root`` (default: this Python's stdlib), sorted."""
    root = root or stdlib_root()
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in EXCLUDED_DIRS and not d.startswith("config-")]
        for name in files:
            if name.endswith(".py") and not name.startswith(EXCLUDED_PREFIXES):
                found.append(os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/"))
    return sorted(found)


def is_validation_file(relpath: str, fraction: float) -> bool:
    h = int.from_bytes(hashlib.sha256(relpath.encode()).digest()[:4], "big")
    return h / 2**32 < fraction


@dataclass(frozen=True)
class Corpus:
    """Training and validation bytes (uint8) and the files each was made of."""

    train: np.ndarray
    val: np.ndarray
    train_files: tuple
    val_files: tuple
    key: str  # identifies the file set: Python version + digest

    def describe(self) -> dict:
        return {"key": self.key, "train_bytes": int(self.train.size), "val_bytes": int(self.val.size),
                "train_files": len(self.train_files), "val_files": len(self.val_files)}


def _corpus_key(root: str, files: list[str]) -> str:
    h = hashlib.sha256()
    for rel in files:
        h.update(f"{rel}\0{os.path.getsize(os.path.join(root, rel))}\n".encode())
    v = sys.version_info
    return f"stdlib-py{v.major}.{v.minor}.{v.micro}-{h.hexdigest()[:16]}"


def _read_files(root: str, files: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """All files concatenated (each ending in a newline) and each file's start offset (plus the end)."""
    chunks, offsets, pos = [], [0], 0
    for rel in files:
        with open(os.path.join(root, rel), "rb") as f:
            b = f.read()
        if not b.endswith(b"\n"):
            b += b"\n"
        chunks.append(b)
        pos += len(b)
        offsets.append(pos)
    return np.frombuffer(b"".join(chunks), dtype=np.uint8), np.array(offsets, dtype=np.int64)


def _load_or_build(root: str, files: list[str], key: str, use_cache: bool):
    path = str(home("corpus", f"{key}.npz"))
    if use_cache and os.path.exists(path):
        try:
            with np.load(path) as z:
                cached_files = json.loads(bytes(z["files"]).decode())
                if cached_files == files:
                    return z["data"], z["offsets"]
        except Exception:  # a damaged cache is rebuilt, it holds nothing that cannot be read again
            pass
    data, offsets = _read_files(root, files)
    if use_cache:
        try:
            with atomic_write(path) as f:
                np.savez(f, data=data, offsets=offsets,
                         files=np.frombuffer(json.dumps(files).encode(), dtype=np.uint8))
        except OSError as e:
            print(f"tilecast: corpus cache not written ({path}: {e.strerror})", file=sys.stderr)
    return data, offsets


def load_corpus(val_fraction: float = 0.05, root: str | None = None, use_cache: bool = True) -> Corpus:
    """The standard-library corpus split into training and validation bytes (see the module doc)."""
    if not 0 < val_fraction < 1:
        raise DataError(f"validation fraction must be between 0 and 1, got {val_fraction}")
    root = root or stdlib_root()
    files = stdlib_files(root)
    if not files:
        raise DataError(f"no .py files under {root}; the corpus is empty")
    key = _corpus_key(root, files)
    data, offsets = _load_or_build(root, files, key, use_cache)
    held = np.array([is_validation_file(f, val_fraction) for f in files], dtype=bool)
    if held.all() or not held.any():
        raise DataError(f"validation fraction {val_fraction} leaves one side of the split empty "
                        f"({len(files)} files)")

    def join(mask):
        return np.concatenate([data[offsets[i]:offsets[i + 1]] for i in np.flatnonzero(mask)])

    return Corpus(train=join(~held), val=join(held),
                  train_files=tuple(f for f, h in zip(files, held) if not h),
                  val_files=tuple(f for f, h in zip(files, held) if h), key=key)


def _windows(data: np.ndarray, starts: np.ndarray, seq: int) -> tuple[np.ndarray, np.ndarray]:
    win = data[starts[:, None] + np.arange(seq + 1)].astype(np.int64)
    return np.ascontiguousarray(win[:, :-1]), np.ascontiguousarray(win[:, 1:])


class BatchSampler:
    """Random training windows: ``next()`` returns ``(ids, targets)``, int64 arrays of shape
    (batch, seq), with ``targets[:, t] = ids[:, t + 1]`` (the next byte) along each window.

    Window starts are uniform over the data, drawn from ``numpy.random.Generator(PCG64(seed))``.
    :meth:`state` is a JSON-ready dict (generator state, draws so far, shapes);
    :meth:`set_state` restores it, after which the batches are exactly those
    the saved sampler would have drawn next.
    """

    def __init__(self, data: np.ndarray, batch: int, seq: int, seed: int = 0):
        if batch < 1 or seq < 1:
            raise DataError(f"batch and seq must be at least 1, got batch={batch}, seq={seq}")
        if data.size <= seq + 1:
            raise DataError(f"the data ({data.size} bytes) is shorter than one window of seq={seq}")
        self.data, self.batch, self.seq, self.seed = data, int(batch), int(seq), int(seed)
        self.rng = np.random.Generator(np.random.PCG64(self.seed))
        self.draws = 0

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        starts = self.rng.integers(0, self.data.size - self.seq, size=self.batch)
        self.draws += 1
        return _windows(self.data, starts, self.seq)

    __next__ = next

    def __iter__(self):
        return self

    def state(self) -> dict:
        return {"batch": self.batch, "seq": self.seq, "seed": self.seed, "data_bytes": int(self.data.size),
                "draws": self.draws, "bit_generator": self.rng.bit_generator.state}

    def set_state(self, state: dict) -> None:
        mine = {"batch": self.batch, "seq": self.seq, "data_bytes": int(self.data.size)}
        theirs = {k: state.get(k) for k in mine}
        if mine != theirs:
            diff = ", ".join(f"{k} {theirs[k]} (saved) vs {mine[k]} (now)" for k in mine if mine[k] != theirs[k])
            raise DataError(f"sampler state does not fit this sampler: {diff}")
        self.rng.bit_generator.state = state["bit_generator"]
        self.seed, self.draws = int(state["seed"]), int(state["draws"])


def validation_batches(data: np.ndarray, batch: int, seq: int,
                       max_batches: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The same validation batches on every call: ``(ids, targets)`` like :class:`BatchSampler`'s.

    Without ``max_batches``: every whole non-overlapping window of ``seq`` bytes in
    order, grouped by ``batch`` (a last incomplete batch is dropped, so all
    batches have one shape). With it: ``max_batches * batch`` windows spread evenly
    over the whole data, so a short evaluation still sees every part of it.
    """
    if data.size <= seq + 1:
        raise DataError(f"the validation data ({data.size} bytes) is shorter than one window of seq={seq}")
    n_windows = (data.size - 1) // seq
    starts = np.arange(n_windows, dtype=np.int64) * seq
    if max_batches is not None and max_batches * batch < n_windows:
        starts = np.linspace(0, data.size - seq - 1, max_batches * batch).astype(np.int64)
    for b in range(len(starts) // batch):
        yield _windows(data, starts[b * batch:(b + 1) * batch], seq)
