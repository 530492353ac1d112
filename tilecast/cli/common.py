"""Flags shared by subcommands, with the same meaning everywhere (docs/design.md), and shared output lines."""

from __future__ import annotations

import contextlib
import json
import re
import sys

from tilecast.cli import UsageError
from tilecast.errors import FieldError
from tilecast.graph import Tiling, TilingError
from tilecast.graph.model_config import PRESETS, ModelConfig, ModelConfigError, load_model

DEFAULT_MODEL = "gpt2"
DEFAULT_BATCH = 4
DEFAULT_SEQ = 256
DEFAULT_TILE = "256"


# Library errors name the field at fault ("workers must be ...", "tile: ..."); the command line names its flag.
FIELD_FLAGS = {f: "--" + f.replace("_", "-") for f in (
    "model", "batch", "seq", "tile", "sched", "workers", "steps", "machine", "cluster", "gpus", "tp", "pp", "dp",
    "global_batch", "micro_batch", "virtual_stages", "zero", "schedule", "recompute", "collective_algo", "dtype",
    "sequence_parallel", "attention", "pipeline_split", "stage_layers", "memory_limit", "offload_dir", "offload_io",
    "ep", "cp", "capacity_factor", "expert_imbalance", "shard_group", "lr", "checkpoint", "checkpoint_every",
    "eval_every", "eval_batches", "resume", "scheds", "tiles", "suite", "execute", "others", "warmup", "max_tasks",
    "ranks", "distribution", "network", "sizes", "before", "table", "target", "lopo_target", "max_error",
    "inference_table", "inference_target", "inference_max_error", "max_configs", "input_len", "output_len",
    "kv_dtype", "request_rate", "max_batch", "params_dtype", "max_wait", "role", "sweep", "distributions",
    "background_threads", "repeats", "per_kernel", "budget", "timer", "output", "round_trips", "baseline")}
FIELD_FLAGS["timeout_s"] = "--timeout"
FIELD_FLAGS["grad_reduce_bytes"] = "--grad-dtype"
FIELD_FLAGS["weight_dtype"] = "--dtype"
_LEADING_FIELDS = re.compile(r"^([a-z_]+(?:/[a-z_]+)*)(?=[: ])")


def as_flags(message: str, flags: dict | None = None) -> str:
    """A library error worded for the command line: the fields it starts with become their flags
    ("seq 9 exceeds ..." -> "--seq 9 exceeds ...", "pp/virtual_stages: ..." -> "--pp/--virtual-stages: ...").
    ``flags``: a command's own field -> flag names, before FIELD_FLAGS (tune's workers are --worker-counts)."""
    table = {**FIELD_FLAGS, **(flags or {})}
    m = _LEADING_FIELDS.match(message)
    names = m.group(1).split("/") if m else []
    if not names or not all(n in table for n in names):
        return message
    return "/".join(table[n] for n in names) + message[m.end():]


def input_error_types() -> tuple:
    """The exceptions that mean bad input (each a ValueError, or CheckpointError, whose message starts with the
    field at fault): FieldError and the packages' own. Imported on first use so that parsing flags stays fast.
    (CalibrationError is not among them: its messages start with the file, and the commands name the flag.)"""
    from tilecast.cluster.hardware import ClusterError
    from tilecast.cluster.inference import InferenceError
    from tilecast.cluster.strategy import StrategyError
    from tilecast.executor.memory_limit import MemoryLimitError
    from tilecast.perfmodel.disk_node import DiskNodeError
    from tilecast.perfmodel.machine import MachineError
    from tilecast.data.checkpoint import CheckpointError
    from tilecast.data.corpus import DataError
    from tilecast.trace import TraceError
    from tilecast.training.loop import TrainingError

    return (FieldError, ModelConfigError, TilingError, MachineError, MemoryLimitError,
            DiskNodeError, ClusterError, StrategyError, InferenceError, TraceError, TrainingError, DataError,
            CheckpointError)


@contextlib.contextmanager
def library_errors(flags: dict | None = None):
    """Bad input from a library call (``tc.*``) as a UsageError worded with flags: the one place where a
    library error's field becomes the command line's flag (:func:`as_flags`; ``flags``: a command's own
    field -> flag names). Other exceptions pass: they are faults, not bad input."""
    try:
        yield
    except input_error_types() as e:
        raise UsageError(as_flags(str(e), flags)) from None


def add_model_args(p, model=DEFAULT_MODEL, batch=DEFAULT_BATCH, seq=DEFAULT_SEQ, tile=DEFAULT_TILE,
                   tile_flag: bool = True, model_default: str | None = None) -> None:
    """--model, --batch, --seq and (unless ``tile_flag`` is False) --tile; ``model_default``: how the help
    names the default model when it is not a --model value (the demo's own)."""
    p.add_argument("--model", default=model, metavar="NAME|FILE.json|JSON",
                   help=f"a preset ({', '.join(PRESETS)}), a transformers config.json (GPT-2 or Llama), or a "
                        f"JSON file or inline JSON object with n_layer, n_embd, n_head, vocab_size, n_positions "
                        f"and optionally family (gpt2, llama), n_kv_head, intermediate_size, "
                        f"tie_word_embeddings, rope_theta, rope_scaling (linear, llama3, dynamic) with "
                        f"rope_factor, rope_low_freq_factor, rope_high_freq_factor, rope_original_positions "
                        f"(default: {model_default or model})")
    p.add_argument("--batch", type=int, default=batch, metavar="N", help=f"sequences per step (default: {batch})")
    p.add_argument("--seq", type=int, default=seq, metavar="N", help=f"tokens per sequence (default: {seq})")
    if tile_flag:
        p.add_argument("--tile", default=tile, metavar="SPEC",
                       help="tile sizes: SIZE for every dimension, and/or name=SIZE for batch, seq, embd, "
                            "head (whole heads), inner, vocab; e.g. 256, seq=128,embd=256,head=2 or 256,head=4; "
                            f"dimensions not named stay untiled (default: {tile})")


def add_recompute_arg(p) -> None:
    p.add_argument("--recompute", default="none", metavar="none|selective|full",
                   help="activation recompute in the tiled step: none keeps every activation the backward pass "
                        "reads; selective recomputes each layer's attention scores and probabilities before its "
                        "backward and keeps the rest (Korthikanti et al. 2022); full keeps only each layer's "
                        "input and replays the layer's forward before its backward (default: none)")


def recompute_arg(args) -> str:
    """The validated --recompute setting; UsageError on bad input."""
    from tilecast.graph.recompute import check_recompute

    try:
        return check_recompute(args.recompute)
    except FieldError as e:
        raise UsageError(as_flags(str(e))) from None


def add_memory_args(p) -> None:
    """--memory-limit and --offload-dir (docs/memory.md)."""
    p.add_argument("--memory-limit", metavar="SIZE",
                   help="limit the main memory StarPU may use for tiles, e.g. 12GiB, 512MiB, 1.5GB (tiles then "
                        "belong to StarPU, which evicts them to --offload-dir when memory is full); a limit below "
                        "the step's smallest working set is refused with the minimum (default: no limit, tiles "
                        "are numpy arrays registered in place)")
    p.add_argument("--offload-dir", metavar="DIR",
                   help="existing, writable directory for StarPU's disk memory node, where tiles evicted under "
                        "--memory-limit go (one file per evicted tile, removed when StarPU stops); without it "
                        "every tile must fit under the limit")
    p.add_argument("--offload-io", choices=["buffered", "direct"], default="buffered",
                   help="how the disk node's files are written and read: through the page cache (buffered, "
                        "StarPU's unistd backend) or with O_DIRECT for every tile of whole pages (direct: no "
                        "copy into the page cache, no reclaim of it; the directory's file system must take "
                        "O_DIRECT); default: buffered")


def memory_args(args):
    """The MemoryLimit of --memory-limit/--offload-dir, or None; UsageError on bad input."""
    from tilecast.executor.memory_limit import (MemoryLimit, MemoryLimitError, check_direct_io, check_offload_dir,
                                                parse_size)

    limit = getattr(args, "memory_limit", None)
    offload = getattr(args, "offload_dir", None)
    io = getattr(args, "offload_io", "buffered") or "buffered"
    if io != "buffered" and offload is None:
        raise UsageError("--offload-io needs --offload-dir")
    if limit is None:
        if offload is not None:
            raise UsageError("--offload-dir needs --memory-limit SIZE")
        return None
    try:
        mem = MemoryLimit(parse_size(limit), offload, io)
        if offload is not None:
            check_offload_dir(offload, 0)  # missing or read-only: before anything is built
            if io == "direct":
                check_direct_io(offload)
    except MemoryLimitError as e:
        raise UsageError(as_flags(str(e))) from None
    return mem


def memory_forecast(limit, machine):
    """The simulator's MemoryForecast of a MemoryLimit (:func:`memory_args`; the disk node measured in its
    offload directory if not yet), or None; UsageError for a disk that cannot be measured."""
    if limit is None:
        return None
    from tilecast.perfmodel.disk_node import DiskNodeError, ensure_disk, for_offload_io
    from tilecast.simulator.memory_capacity import MemoryForecast

    disk = None
    if limit.offload_dir is not None:
        try:
            disk = for_offload_io(ensure_disk(machine, limit.offload_dir), limit.offload_io)
        except DiskNodeError as e:
            raise UsageError(as_flags(str(e))) from None
    return MemoryForecast(limit.limit_bytes, disk)


def add_json_arg(p) -> None:
    p.add_argument("--json", action="store_true",
                   help="print exactly one JSON object on standard output (progress goes to standard error)")


def add_out_arg(p, default: str | None, what: str) -> None:
    """--out DIR: the folder a command writes its files into (compare, demo, simulate, tune)."""
    p.add_argument("--out", default=default, metavar="DIR",
                   help=f"folder to write {what} into (default: {default or 'none written'})")


def add_steps_arg(p, default: int, detail: str) -> None:
    """--steps N: how many training steps a run executes and times."""
    p.add_argument("--steps", type=int, default=default, metavar="N",
                   help=f"training steps run and timed {detail} (default: {default})")


def add_workers_arg(p, detail: str, default=None) -> None:
    """--workers N: one count of CPU workers (a search over several counts takes --worker-counts)."""
    p.add_argument("--workers", type=int, default=default, metavar="N", help=f"workers: {detail}")


def add_worker_counts_arg(p, detail: str) -> None:
    """--worker-counts LIST: the worker counts a search or a suite takes in turn."""
    p.add_argument("--worker-counts", default=None, metavar="LIST",
                   help=f"CPU worker counts to take in turn, e.g. 1,2 (default: {detail})")


def add_scheds_arg(p, default, detail: str) -> None:
    """--scheds LIST: the StarPU scheduling policies a search or a suite takes in turn (--sched: one)."""
    p.add_argument("--scheds", default=default, metavar="LIST",
                   help=f"StarPU scheduling policies to take in turn, e.g. eager,dmda (default: {detail})")


def add_tiles_arg(p, default, detail: str) -> None:
    """--tiles SPEC;SPEC: several tilings, read by :func:`tilings_arg` (--tile: one)."""
    p.add_argument("--tiles", default=default, metavar="SPEC;SPEC",
                   help="tilings, each a --tile SPEC, separated by ';' (quote them), or uniform sizes separated by "
                        f"',' (32,64,128); {detail}")


def parse_list(text, flag: str, conv=str) -> list:
    """A comma-separated flag value as a list (``conv`` on each item); UsageError naming ``flag``."""
    try:
        out = [conv(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag}: expected a comma-separated list, got {text!r}") from None
    if not out:
        raise UsageError(f"{flag}: empty list")
    return out


def tilings_arg(text, flag: str = "--tiles") -> list[Tiling]:
    """The tilings of a --tiles value: specs separated by ';', or uniform sizes separated by ','
    ("32,64,128", which as one spec would be an error); [] for an empty value; UsageError naming ``flag``."""
    text = text or ""
    items = [s for s in text.split(";") if s.strip()]
    if len(items) == 1 and all(x.strip().isdigit() for x in items[0].split(",")):
        items = [x for x in items[0].split(",") if x.strip()]
    try:
        return [Tiling.parse(s) for s in items]
    except TilingError as e:
        raise UsageError(as_flags(str(e), {"tile": flag})) from None


def check_model(spec, batch: int, seq: int) -> ModelConfig:
    """The ModelConfig of a --model value (or a ModelConfig) checked with --batch and --seq; UsageError."""
    try:
        cfg = (spec if isinstance(spec, ModelConfig) else load_model(spec)).check_tiled()
    except ModelConfigError as e:
        raise UsageError(as_flags(str(e))) from None
    try:
        cfg.check_batch_seq(batch, seq)
    except FieldError as e:
        raise UsageError(as_flags(str(e))) from None
    return cfg


def model_args(args) -> tuple[ModelConfig, int, int, Tiling]:
    """Validated (model, batch, seq, tiling) from the shared flags; UsageError on bad input."""
    cfg = check_model(args.model, args.batch, args.seq)
    try:
        tiling = Tiling.parse(args.tile)
        if cfg.family == "llama":
            from tilecast.graph.llama import kv_head_tile

            kv_head_tile(cfg, tiling)  # head tiles hold whole groups of query heads
    except TilingError as e:
        raise UsageError(as_flags(str(e))) from None
    return cfg, args.batch, args.seq, tiling


def check_numeric(cfg: ModelConfig) -> None:
    """UsageError when the tile kernels cannot train ``cfg`` with transformers' numbers (run, train)."""
    err = cfg.numeric_error()
    if err:
        raise UsageError(as_flags(err))


def check_host_memory(cfg: ModelConfig) -> None:
    """UsageError when the model's parameters, gradients and AdamW moments (16 bytes a parameter in float32,
    before any activation) exceed this machine's memory: a step here would exhaust it."""
    from tilecast.perfmodel.local import memory_bytes

    need, have = 16 * cfg.n_params(), memory_bytes()
    if need > have:
        raise UsageError(f"--model: {cfg.name} needs at least {human(need, 'B')} of memory to train here (16 bytes "
                         f"for each of its {human(cfg.n_params())} parameters: weights, gradients, AdamW moments; "
                         f"activations come on top) and this machine has {human(have, 'B')}; --memory-limit with "
                         f"--offload-dir keeps only a working set in memory, tilecast simulate or whatif forecast it")


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, default=float)
    sys.stdout.write("\n")


def human(n: float, unit: str = "") -> str:
    """1234567 -> '1.23 M' style figures for tables."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {prefix}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def quiet_check_line(quiet: dict, rows: list) -> str:
    """One line on how the quiet check went (tilecast.loop.interference): the reference, retakes, waiting."""
    disturbed = sum(r.get("sessions_disturbed", 0) for r in rows)
    return (f"quiet check, reference step {quiet['reference']}: fastest {quiet['reference_best_s'] * 1e3:.1f} ms "
            f"over {quiet['reference_probes']} probes; {quiet['sessions_retaken']} sessions retaken, "
            f"{quiet['waited_s']:.0f} s waited for slow spells to pass, {disturbed} kept though disturbed")


_BLAS_WARNED: list = []


def blas_summary() -> tuple[dict, str]:
    """The C kernels' BLAS for a command's output: its JSON object and one line for people.

    A fallback core (kernels older than the CPU) is warned about once per process on standard error.
    Where the BLAS cannot be loaded, the line says why (the command itself fails later if it needs it).
    """
    from tilecast.kernels.blas import blas_info
    from tilecast.kernels.native_build import NativeUnavailable

    try:
        info = blas_info()
    except NativeUnavailable as e:
        return {"error": str(e)}, f"BLAS: unavailable ({e})"
    warning = info.warning()
    if warning and not _BLAS_WARNED:
        _BLAS_WARNED.append(True)
        print(warning, file=sys.stderr)
    return info.to_dict(), f"BLAS: {info.describe()}, one thread per worker"
