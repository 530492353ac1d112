"""Training checkpoints: parameters, AdamW moments, step, data and RNG state, in one atomic file.

A checkpoint is a ``numpy.savez`` archive (a zip of ``.npy`` files) written
through :func:`~tilecast.atomic_file.atomic_write`, so a crash or
Ctrl-C while saving leaves the previous checkpoint intact. Its ``manifest``
member (JSON) holds the format version, the model shape, the tiling, the step,
the sampler and RNG states, free-form ``extra`` values, the name, dtype and
shape of every array, and the SHA-256 of the array payload.

Loading never falls back silently: a missing file, a damaged one (truncated,
bit-flipped: the zip CRC or the payload checksum disagrees), a file that is not
a checkpoint, or one for another model shape raises :class:`CheckpointError`
with one line saying which.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from dataclasses import dataclass, field

import numpy as np

from tilecast.atomic_file import atomic_write

FORMAT = "tilecast-checkpoint"
FORMAT_VERSION = 1
GROUPS = ("params", "adam_m", "adam_v")


class CheckpointError(Exception):
    """A checkpoint that cannot be resumed from; the message is one line naming the file and why."""


@dataclass
class Checkpoint:
    """What a checkpoint holds. ``params``/``adam_m``/``adam_v`` map tensor names to arrays."""

    params: dict
    adam_m: dict
    adam_v: dict
    step: int
    sampler_state: dict
    rng_state: dict
    model: dict
    tiling: dict
    extra: dict = field(default_factory=dict)


def _shape_dict(model) -> dict:
    """A model shape from a dict or an object with ``shape()`` (``ModelConfig``)."""
    return dict(model.shape()) if hasattr(model, "shape") and callable(model.shape) else dict(model)


def _tiling_dict(tiling) -> dict:
    return dict(getattr(tiling, "sizes", tiling) or {})


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    return x


def _digest_update(h, e: dict, a: np.ndarray) -> None:
    h.update(json.dumps([e["group"], e["name"], e["dtype"], e["shape"]]).encode())
    h.update(np.ascontiguousarray(a).reshape(-1).view(np.uint8))  # the raw bytes, no copy


def _payload_digest(entries: list, arrays: list) -> str:
    h = hashlib.sha256()
    for e, a in zip(entries, arrays):
        _digest_update(h, e, a)
    return h.hexdigest()


def save_checkpoint(path: str, *, params: dict, adam_m: dict, adam_v: dict, step: int,
                    sampler_state: dict, rng_state: dict, model, tiling, extra: dict | None = None) -> str:
    """Write a checkpoint to ``path`` atomically; return ``path``.

    ``adam_m`` and ``adam_v`` must have the same names and shapes as ``params``.
    ``sampler_state``, ``rng_state`` and ``extra`` must be JSON-ready (numpy
    arrays and scalars inside them are converted to lists and numbers), e.g.
    ``BatchSampler.state()`` and ``Generator.bit_generator.state``.
    """
    for group, d in (("adam_m", adam_m), ("adam_v", adam_v)):
        if d.keys() != params.keys():
            raise ValueError(f"checkpoint: {group} names differ from the parameter names")
        bad = [n for n in params if np.shape(d[n]) != np.shape(params[n])]
        if bad:
            raise ValueError(f"checkpoint: {group}[{bad[0]!r}] has shape {np.shape(d[bad[0]])}, "
                             f"the parameter {np.shape(params[bad[0]])}")
    shapes = {n: np.shape(params[n]) for n in params}
    tables = {"params": params, "adam_m": adam_m, "adam_v": adam_v}
    return write_checkpoint(path, shapes, lambda group, name: tables[group][name], step=step,
                            sampler_state=sampler_state, rng_state=rng_state, model=model, tiling=tiling, extra=extra)


def write_checkpoint(path: str, names, read, *, step: int, sampler_state: dict, rng_state: dict, model, tiling,
                     extra: dict | None = None) -> str:
    """Write a checkpoint of the parameters ``names`` (a name -> shape mapping) atomically, one array at a
    time: ``read(group, name)`` gives each array (group: ``params``, ``adam_m`` or ``adam_v``) when it is
    written, so that at most one array is held at once (a model larger than memory is read from StarPU's
    tiles tensor by tensor). The file is the one :func:`save_checkpoint` writes."""
    entries, digest = [], hashlib.sha256()
    with atomic_write(path) as f, zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED,
                                                  allowZip64=True) as z:
        for group in GROUPS:
            for name in sorted(names):
                a = np.asarray(read(group, name))
                if a.shape != tuple(names[name]):
                    raise ValueError(f"checkpoint: {group}[{name!r}] has shape {a.shape}, the parameter "
                                     f"{tuple(names[name])}")
                e = {"group": group, "name": name, "key": f"a{len(entries)}", "dtype": a.dtype.str,
                     "shape": list(a.shape)}
                entries.append(e)
                _digest_update(digest, e, a)
                with z.open(e["key"] + ".npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, a, allow_pickle=False)
                del a
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "step": int(step),
            "model": _jsonable(_shape_dict(model)), "tiling": _jsonable(_tiling_dict(tiling)),
            "sampler_state": _jsonable(sampler_state), "rng_state": _jsonable(rng_state),
            "extra": _jsonable(extra or {}), "arrays": entries,
            "checksum": {"algorithm": "sha256", "hex": digest.hexdigest()},
        }
        text = json.dumps(manifest, allow_nan=False).encode()
        with z.open("manifest.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array(member, np.frombuffer(text, dtype=np.uint8), allow_pickle=False)
    return path


def _damaged(path: str, why) -> CheckpointError:
    first = (str(why).strip().splitlines() or [type(why).__name__])[0]
    return CheckpointError(f"checkpoint {path}: the file is corrupted or not a checkpoint ({first})")


def _check_expected(path: str, what: str, saved: dict, expected: dict) -> None:
    if saved == expected:
        return
    diff = [f"{k}={saved.get(k)} in the checkpoint, {expected.get(k)} requested"
            for k in sorted(set(saved) | set(expected)) if saved.get(k) != expected.get(k)]
    raise CheckpointError(f"checkpoint {path}: {what} differs: " + "; ".join(diff))


def read_manifest(path: str) -> dict:
    """The manifest only (cheap: no array is read)."""
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint {path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as z:
            if "manifest" not in z.files:
                raise CheckpointError(f"checkpoint {path}: not a tilecast checkpoint (no manifest)")
            manifest = json.loads(bytes(z["manifest"]).decode())
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, EOFError, ValueError, OSError, UnicodeDecodeError, KeyError) as e:
        raise _damaged(path, e) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path}: not a tilecast checkpoint")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path}: format version {manifest.get('format_version')}, "
                              f"this tilecast reads version {FORMAT_VERSION}")
    return manifest


def load_checkpoint(path: str, *, model=None, tiling=None) -> Checkpoint:
    """Read and verify a checkpoint.

    ``model`` (a shape dict or ``ModelConfig``) and ``tiling`` (a dict or
    ``Tiling``), when given, must equal what the checkpoint was saved with.
    Raises :class:`CheckpointError` for a missing, damaged or mismatched file.
    """
    manifest = _expected_manifest(path, model, tiling)
    entries = manifest["arrays"]
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = [z[e["key"]] for e in entries]
    except (zipfile.BadZipFile, EOFError, ValueError, OSError, KeyError) as e:
        raise _damaged(path, e) from None
    for e, a in zip(entries, arrays):
        if a.dtype.str != e["dtype"] or list(a.shape) != e["shape"]:
            raise _damaged(path, f"array {e['group']}/{e['name']} is {a.dtype.str}{list(a.shape)}, "
                                 f"the manifest says {e['dtype']}{e['shape']}")
    if _payload_digest(entries, arrays) != manifest["checksum"]["hex"]:
        raise CheckpointError(f"checkpoint {path}: checksum mismatch, the file is corrupted")
    groups = {g: {} for g in GROUPS}
    for e, a in zip(entries, arrays):
        groups[e["group"]][e["name"]] = a
    return Checkpoint(**groups, step=manifest["step"], sampler_state=manifest["sampler_state"],
                      rng_state=manifest["rng_state"], model=manifest["model"], tiling=manifest["tiling"],
                      extra=manifest["extra"])


def verify_checkpoint(path: str, *, model=None, tiling=None) -> Checkpoint:
    """:func:`load_checkpoint` without keeping the arrays: every array is read and checked one at a time
    (dtype, shape, the payload checksum) and dropped; the result's ``params``/``adam_m``/``adam_v`` are
    empty (:func:`checkpoint_arrays` reads them again, one at a time)."""
    manifest = _expected_manifest(path, model, tiling)
    h = hashlib.sha256()
    for e, a in _arrays(path, manifest["arrays"]):
        _digest_update(h, e, a)
    if h.hexdigest() != manifest["checksum"]["hex"]:
        raise CheckpointError(f"checkpoint {path}: checksum mismatch, the file is corrupted")
    return Checkpoint(params={}, adam_m={}, adam_v={}, step=manifest["step"],
                      sampler_state=manifest["sampler_state"], rng_state=manifest["rng_state"],
                      model=manifest["model"], tiling=manifest["tiling"], extra=manifest["extra"])


def checkpoint_arrays(path: str):
    """(group, name, array) of every array of a checkpoint, one at a time (check it first with
    :func:`verify_checkpoint`)."""
    for e, a in _arrays(path, read_manifest(path)["arrays"]):
        yield e["group"], e["name"], a


def _expected_manifest(path: str, model, tiling) -> dict:
    manifest = read_manifest(path)
    if model is not None:
        _check_expected(path, "model shape", manifest["model"], _jsonable(_shape_dict(model)))
    if tiling is not None:
        _check_expected(path, "tiling", manifest["tiling"], _jsonable(_tiling_dict(tiling)))
    return manifest


def _arrays(path: str, entries: list):
    """(entry, array) of ``entries``, read one at a time, each checked against its entry."""
    try:
        with np.load(path, allow_pickle=False) as z:
            for e in entries:
                a = z[e["key"]]
                if a.dtype.str != e["dtype"] or list(a.shape) != e["shape"]:
                    raise _damaged(path, f"array {e['group']}/{e['name']} is {a.dtype.str}{list(a.shape)}, "
                                         f"the manifest says {e['dtype']}{e['shape']}")
                yield e, a
                del a
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, EOFError, ValueError, OSError, KeyError) as e:
        raise _damaged(path, e) from None
