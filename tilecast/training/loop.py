"""A real training run on StarPU: a GPT-2 or Llama model on the standard-library byte corpus, with validation
and checkpoints.

The step graph is built once; parameters and AdamW moments stay in its tiles
from step to step (AdamW tasks update them in place), and only the batch and
AdamW's step number change. Every ``eval_every`` steps the forward-only graph
computes the validation loss on the same parameter tiles.

Resuming is exact: the checkpoint holds the parameters, both AdamW moments,
the step, the batch sampler's generator state and the loss history, and
StarPU's results do not depend on which worker ran a task (every accumulation
into a tile is ordered by the graph's dependencies), so a resumed run repeats
the losses of an uninterrupted one bit for bit.

Ctrl-C (SIGINT) lets the running step finish, writes the checkpoint and stops;
a second Ctrl-C abandons the step (the last checkpoint written stays valid).
A non-finite training loss stops the run without writing a checkpoint.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from tilecast.data.checkpoint import (CheckpointError, checkpoint_arrays, load_checkpoint, verify_checkpoint,
                                          write_checkpoint)
from tilecast.data.corpus import VOCAB_SIZE, BatchSampler, load_corpus, validation_batches
from tilecast.training.evaluation import Evaluator
from tilecast.reference.step import TrainState, init_params, load_initial, load_step, set_batch, step_loss
from tilecast.executor.starpu_run import peak_rss_bytes, session_store
from tilecast.graph.gpt2 import AdamWConfig, adam_names
from tilecast.graph.models import build_forward, build_step, model_parameters


class TrainingError(ValueError):
    """Training options that cannot be used; one line naming the option and why."""


@dataclass
class TrainOptions:
    cfg: object
    batch: int
    seq: int
    tiling: object
    steps: int
    lr: float = 3e-3
    sched: str = "dmda"
    workers: int | None = None
    eval_every: int = 100
    eval_batches: int = 8
    checkpoint: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    seed: int = 0
    initial_params: dict | None = None  # parameter name -> array; default: the family's initialisation from ``seed``
    recompute: str = "none"  # activation recompute in the step (tilecast.graph.recompute): same losses, less memory
    memory: object = None  # a MemoryLimit (tilecast.executor.memory_limit): StarPU-managed tiles, disk offload


@dataclass
class TrainResult:
    """Losses by step (1-based: ``losses[k - 1]`` is step k's training loss), validation losses by step."""

    losses: list[float]
    val: list[tuple[int, float]]
    step: int
    start_step: int
    step_time_s: float
    wall_s: float
    tokens_per_step: int
    interrupted: bool = False
    diverged: bool = False  # the training loss became NaN or infinite; training stopped there
    checkpoints: list[tuple[int, str]] = field(default_factory=list)  # (step, path) of each written
    workers: list[str] = field(default_factory=list)
    n_tasks: int = 0
    peak_rss_bytes: int = 0  # the process's peak resident set size at the end of the run (VmHWM)

    @property
    def tokens_per_s(self) -> float:
        done = self.step - self.start_step
        return done * self.tokens_per_step / self.step_time_s if self.step_time_s > 0 else float("nan")


class _Interrupts:
    """SIGINT sets a flag (the step in flight finishes); a second SIGINT raises KeyboardInterrupt."""

    def __init__(self):
        self.requested = False
        self._old = None

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def _run_settings(o: TrainOptions, corpus_key: str) -> dict:
    """What must be equal between a checkpoint and the run resuming it for the losses to repeat exactly."""
    return {"adamw": asdict(AdamWConfig(lr=o.lr)), "batch": o.batch, "seq": o.seq, "seed": o.seed,
            "corpus": corpus_key}


def _resume(o: TrainOptions, settings: dict, sampler: BatchSampler, streamed: bool = False):
    """(state, losses, validation losses) of the checkpoint; ``streamed``: the state's arrays are not read
    (only checked, one at a time): :class:`StreamedState` loads them into the tiles later."""
    c = (verify_checkpoint if streamed else load_checkpoint)(o.checkpoint, model=o.cfg, tiling=o.tiling)
    saved = c.extra.get("settings")
    if not isinstance(saved, dict):
        raise CheckpointError(f"checkpoint {o.checkpoint}: not written by tilecast train (no run settings)")
    diff = [f"{k}={saved.get(k)} in the checkpoint, {settings[k]} requested" for k in settings
            if saved.get(k) != settings[k]]
    if diff:
        raise CheckpointError(f"checkpoint {o.checkpoint}: run settings differ: " + "; ".join(diff))
    try:
        sampler.set_state(c.sampler_state)
    except Exception as e:  # DataError or a malformed generator state
        raise CheckpointError(f"checkpoint {o.checkpoint}: {e}") from None
    if sampler.draws != c.step:
        raise CheckpointError(f"checkpoint {o.checkpoint}: the sampler drew {sampler.draws} batches "
                              f"at step {c.step}")
    state = StreamedState(o.checkpoint, c.step) if streamed else TrainState(c.params, c.adam_m, c.adam_v, c.step)
    losses = [float(x) for x in c.extra.get("losses", [])]
    val = [(int(s), float(v)) for s, v in c.extra.get("val", [])]
    if len(losses) != c.step:
        raise CheckpointError(f"checkpoint {o.checkpoint}: {len(losses)} losses recorded for step {c.step}")
    return state, losses, val


@dataclass
class StreamedState:
    """A training state loaded into StarPU-managed tiles one tensor at a time, never whole in numpy (under a
    memory limit): from a checkpoint file (``path``), from ``initial`` parameters (zero moments) or, with
    neither, from the family's initialisation with ``seed``."""

    path: str | None = None
    step: int = 0
    initial: dict | None = None
    seed: int = 0

    def load(self, graph, cfg, store, ids, targets):
        if self.path is None and self.initial is None:
            return load_initial(graph, cfg, self.seed, ids, targets, store)
        if self.path is not None:
            for group, name, a in checkpoint_arrays(self.path):
                store.set_tensor(name if group == "params" else adam_names(name)[group == "adam_v"], a)
                del a
        else:
            for name, p in self.initial.items():
                p = np.asarray(p, dtype=np.float32)
                store.set_tensor(name, p)
                zeros = np.zeros(p.shape, dtype=np.float32)
                for moment in adam_names(name):
                    store.set_tensor(moment, zeros)
                del p, zeros
        set_batch(graph, store, ids, targets, self.step + 1)
        return store


def validate_options(o: TrainOptions) -> None:
    if o.cfg.vocab_size != VOCAB_SIZE:
        raise TrainingError(f"model: vocab_size must be {VOCAB_SIZE} to train on the byte corpus, "
                            f"got {o.cfg.vocab_size}")
    for name, value, low in (("steps", o.steps, 1), ("eval_every", o.eval_every, 0),
                             ("eval_batches", o.eval_batches, 1), ("checkpoint_every", o.checkpoint_every, 0)):
        if value < low:
            raise TrainingError(f"{name} must be at least {low}, got {value}")
    if not (o.lr > 0 and math.isfinite(o.lr)):
        raise TrainingError(f"lr must be a positive number, got {o.lr}")
    if (o.resume or o.checkpoint_every) and not o.checkpoint:
        raise TrainingError(f"{'resume' if o.resume else 'checkpoint_every'} needs a checkpoint path")
    if o.checkpoint and not o.resume:
        if os.path.exists(o.checkpoint):
            raise TrainingError(f"checkpoint: {o.checkpoint} exists; resume from it, or remove it to start "
                                "afresh")
        folder = os.path.dirname(os.path.abspath(o.checkpoint))
        if not os.path.isdir(folder):
            raise TrainingError(f"checkpoint: no such directory {folder}")


def train(o: TrainOptions, progress=None, log=print) -> TrainResult:
    """Train ``o.cfg`` on StarPU until step ``o.steps`` (counting the steps of a resumed checkpoint).

    ``progress(step, loss, tokens_per_s, val)`` is called after every step;
    ``log(line)`` receives validation and checkpoint messages.
    Raises :class:`TrainingError`, :class:`~tilecast.data.corpus.DataError` or
    :class:`CheckpointError` for bad input, before StarPU starts.
    """
    from tilecast.executor.starpu_session import StarPUSession

    t_wall = time.perf_counter()
    validate_options(o)
    corpus = load_corpus()
    sampler = BatchSampler(corpus.train, o.batch, o.seq, seed=o.seed)
    val_batches = list(validation_batches(corpus.val, o.batch, o.seq, o.eval_batches))
    if not val_batches:
        raise TrainingError(f"batch/seq: the validation split ({corpus.val.size} bytes) holds less than one "
                            f"batch of {o.batch} x {o.seq}")
    settings = _run_settings(o, corpus.key)
    # Under a memory limit no host copy of the whole state is made: it goes into StarPU's tiles one tensor at
    # a time, and checkpoints are read back from them one tensor at a time.
    streamed = o.memory is not None
    if o.resume:
        state, losses, val = _resume(o, settings, sampler, streamed)
    elif streamed:
        state, losses, val = StreamedState(initial=o.initial_params, seed=o.seed), [], []
    else:
        state = TrainState(init_params(o.cfg, o.seed) if o.initial_params is None else
                           {k: np.array(v, dtype=np.float32) for k, v in o.initial_params.items()})
        losses, val = [], []
    session = StarPUSession(o.sched, o.workers, memory=o.memory)  # checks the scheduler and worker count
    graph = build_step(o.cfg, o.batch, o.seq, o.tiling, AdamWConfig(lr=o.lr), recompute=o.recompute)
    forward = build_forward(o.cfg, o.batch, o.seq, o.tiling)
    if o.memory is not None:
        o.memory.check([graph, forward], session.n_cpus)
    start = state.step
    res = TrainResult(losses=losses, val=val, step=start, start_step=start, step_time_s=0.0, wall_s=0.0,
                      tokens_per_step=o.batch * o.seq, n_tasks=graph.n_tasks)
    store = evaluator = None

    shapes = {n: shape for n, (shape, _) in model_parameters(o.cfg).items()}

    def read_tensor(group: str, name: str):
        return store.tensor(name if group == "params" else adam_names(name)[group == "adam_v"])

    def checkpoint(why: str) -> None:
        # one tensor at a time, read from the tiles as it is written (tiles on disk come back first)
        path = write_checkpoint(
            o.checkpoint, shapes, read_tensor, step=res.step, sampler_state=sampler.state(),
            rng_state={"init": {"seed": o.seed, "generator": "numpy.random.default_rng"}}, model=o.cfg,
            tiling=o.tiling, extra={"settings": settings, "losses": res.losses, "val": res.val})
        res.checkpoints.append((res.step, path))
        log(f"step {res.step}: checkpoint written to {path} ({why})")

    def evaluate() -> None:
        v = evaluator.loss(session)
        res.val.append((res.step, v))
        log(f"step {res.step}: validation loss {v:.4f}")

    with _Interrupts() as interrupts, session:
        # Under a memory limit the tiles are StarPU's, registered on the running session.
        if isinstance(state, StreamedState):
            store = state.load(graph, o.cfg, session_store(session, graph), *_empty_batch(o))
        else:
            store = load_step(graph, state, *_empty_batch(o), store=session_store(session, graph))
        state = None  # the tiles hold it now: no host copy stays alive during the run
        evaluator = Evaluator(o.cfg, o.batch, o.seq, o.tiling, store, val_batches, graph=forward)
        res.workers = list(session.worker_names)
        if res.step == 0 and o.eval_every:
            evaluate()
        while res.step < o.steps and not interrupts.requested:
            ids, targets = sampler.next()
            t0 = time.perf_counter()
            set_batch(graph, store, ids, targets, res.step + 1)
            session.execute(graph, store, trace=False)
            dt = time.perf_counter() - t0
            res.step_time_s += dt
            res.step += 1
            res.losses.append(step_loss(store))
            if not math.isfinite(res.losses[-1]):
                res.diverged = True
                log(f"step {res.step}: training loss {res.losses[-1]}, stopping (the learning rate lr may be too high)")
                break
            if o.eval_every and (res.step % o.eval_every == 0 or res.step == o.steps):
                evaluate()
            if progress:
                progress(res.step, res.losses[-1], res.tokens_per_step / dt, res.val[-1][1] if res.val else None)
            if o.checkpoint_every and res.step % o.checkpoint_every == 0 and res.step < o.steps:
                checkpoint("every %d steps" % o.checkpoint_every)
        res.interrupted = interrupts.requested and res.step < o.steps
        saved = bool(res.checkpoints) and res.checkpoints[-1][0] == res.step
        if o.checkpoint and res.step > start and not res.diverged and not saved:
            checkpoint("interrupted" if res.interrupted else "end of run")
    res.wall_s = time.perf_counter() - t_wall
    res.peak_rss_bytes = peak_rss_bytes()
    return res


def _empty_batch(o: TrainOptions):
    z = np.zeros((o.batch, o.seq), dtype=np.int64)
    return z, z
