"""Checkpoints of a training run on StarPU-MPI ranks: each rank its own shard, one manifest.

A checkpoint is a directory. At step S every rank writes the parameter and
AdamW-moment tiles it owns to ``rank<R>-step<S>.npz`` (tile ids, their values
and the SHA-256 of both, through :func:`~tilecast.atomic_file.atomic_write`);
after a barrier rank 0 writes ``manifest.json`` (atomically): the format, the
run's settings (model, tiling, batch, seq, seed, lr, ranks, distribution),
the step, the batch sampler's state and every shard with its checksum; after
another barrier each rank removes its shards of earlier steps. A run stopped
at any point leaves the previous manifest and the shards it names intact, so
a checkpoint is never half written. Resuming reads the manifest, refuses one
whose settings differ from the run's (one line naming them), and each rank
loads its own shard, checked against the manifest's checksum.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from tilecast.atomic_file import atomic_write
from tilecast.data.checkpoint import CheckpointError

FORMAT = "tilecast-mpi-checkpoint"
MANIFEST = "manifest.json"
SHARD = "rank{rank}-step{step}.npz"
STATE_KINDS = ("param", "optim")


def state_tiles(graph) -> np.ndarray:
    """Per tile: is it a parameter or an AdamW moment (what a checkpoint keeps)?"""
    kinds = np.array([t.kind in STATE_KINDS for t in graph.tensors])
    return kinds[graph.tile_tensor]


def _digest(ids: np.ndarray, values: np.ndarray) -> str:
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(ids, dtype=np.int64).view(np.uint8))
    h.update(np.ascontiguousarray(values, dtype=np.float32).view(np.uint8))
    return h.hexdigest()


def save_shard(folder, rank: int, step: int, graph, store, owner: np.ndarray) -> dict:
    """Write this rank's state tiles; returns the shard's manifest entry."""
    ids = np.flatnonzero(state_tiles(graph) & (owner == rank)).astype(np.int64)
    values = np.concatenate([store.buffers[i].astype(np.float32, copy=False).ravel() for i in ids.tolist()]) \
        if len(ids) else np.zeros(0, np.float32)
    name = SHARD.format(rank=rank, step=step)
    with atomic_write(Path(folder) / name) as f:
        np.savez(f, tiles=ids, values=values)
    return {"rank": rank, "file": name, "tiles": int(len(ids)), "sha256": _digest(ids, values)}


def write_manifest(folder, settings: dict, step: int, sampler_state: dict, shards: list) -> str:
    doc = {"format": FORMAT, "version": 1, "settings": settings, "step": step, "sampler_state": sampler_state,
           "shards": sorted(shards, key=lambda s: s["rank"])}
    path = Path(folder) / MANIFEST
    with atomic_write(path, "w") as f:
        json.dump(doc, f)
    return str(path)


def read_manifest(folder, settings: dict | None = None) -> dict:
    """The manifest of checkpoint ``folder``; CheckpointError (one line) when it is missing, damaged, or its
    settings differ from ``settings``."""
    path = Path(folder) / MANIFEST
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {folder}: no {MANIFEST} (not a checkpoint of a training run on ranks)") \
            from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {folder}: {MANIFEST} is damaged ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {folder}: not a checkpoint of a training run on ranks")
    if settings is not None:
        saved = doc.get("settings", {})
        diff = [f"{k}={saved.get(k)!r} in the checkpoint, {v!r} requested" for k, v in settings.items()
                if saved.get(k) != v]
        if diff:
            raise CheckpointError(f"checkpoint {folder}: run settings differ: " + "; ".join(diff))
    return doc


def load_shard(folder, manifest: dict, rank: int, graph, store, owner: np.ndarray) -> None:
    """Put this rank's saved state tiles into ``store`` (checked against the manifest)."""
    entry = next((s for s in manifest["shards"] if s["rank"] == rank), None)
    if entry is None:
        raise CheckpointError(f"checkpoint {folder}: no shard for rank {rank}")
    try:
        with np.load(Path(folder) / entry["file"]) as z:
            ids, values = z["tiles"], z["values"]
    except (OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"checkpoint {folder}: shard {entry['file']} unreadable ({e})") from None
    if _digest(ids, values) != entry["sha256"]:
        raise CheckpointError(f"checkpoint {folder}: shard {entry['file']} does not match its checksum")
    want = np.flatnonzero(state_tiles(graph) & (owner == rank))
    if not np.array_equal(ids, want):
        raise CheckpointError(f"checkpoint {folder}: shard {entry['file']} holds other tiles than rank {rank} owns")
    pos = 0
    for i in ids.tolist():
        b = store.buffers[i]
        b[...] = values[pos:pos + b.size].reshape(b.shape)
        pos += b.size


def remove_old_shards(folder, rank: int, keep_step: int) -> None:
    for p in Path(folder).glob(f"rank{rank}-step*.npz"):
        if p.name != SHARD.format(rank=rank, step=keep_step):
            try:
                os.remove(p)
            except OSError:
                pass
