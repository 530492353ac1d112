"""``tc.train``: a training run on StarPU on the Python standard library's source bytes (``tilecast train``).
Bad input raises a ValueError whose message starts with the argument at fault (FieldError, TrainingError,
DataError, MemoryLimitError, ModelConfigError, TilingError); a checkpoint that cannot be used raises
``CheckpointError``."""

from __future__ import annotations

from dataclasses import dataclass, field

from tilecast.api.base import _config, _Result, _shape, _tiling
from tilecast.errors import FieldError


@dataclass
class TrainResult(_Result):
    """A training run (``tilecast train``): ``losses`` (step k's training loss at ``k - 1 - start_step``),
    validation losses by step, throughput; ``to_frame()`` has one row per step run (step, loss, and the
    validation loss where one was computed)."""

    model: str
    batch: int
    seq: int
    tiling: str
    sched: str
    workers: int
    tasks_per_step: int
    lr: float
    steps: int  # the last step reached
    start_step: int  # the step training resumed from (0: from the start)
    interrupted: bool
    diverged: bool
    losses: list
    val_losses: list  # [(step, loss)]
    tokens_per_s: float
    step_time_s: float
    wall_s: float
    checkpoint: str | None
    peak_rss_bytes: int
    result: object = field(repr=False, default=None)  # tilecast.training.loop.TrainResult

    def to_frame(self):
        import pandas as pd

        val = dict(self.val_losses)
        return pd.DataFrame([{"step": self.start_step + i + 1, "loss": loss,
                              "val_loss": val.get(self.start_step + i + 1)} for i, loss in enumerate(self.losses)])

    def _headline(self) -> str:
        last = f", loss {self.losses[-1]:.4f}" if self.losses else ""
        return f"{self.model}: steps {self.start_step + 1}-{self.steps}{last}, {self.tokens_per_s:.0f} tokens/s"


def train(model="gpt2-tiny", batch: int = 16, seq: int = 128, tile="batch=4", steps: int = 1000, lr: float = 3e-3,
          sched: str = "eager", workers: int | None = None, eval_every: int = 100, eval_batches: int = 8,
          checkpoint: str | None = None, checkpoint_every: int = 0, resume: bool = False, seed: int = 0,
          recompute: str = "none", memory_limit: str | int | None = None, offload_dir: str | None = None,
          progress=None, log=None, offload_io: str = "buffered") -> TrainResult:
    """Train ``model`` (vocab_size 256: tokens are bytes) on StarPU with AdamW until step ``steps`` (a resumed
    checkpoint's steps included), with a validation loss every ``eval_every`` steps (``tilecast train``).
    ``checkpoint``: a file written atomically every ``checkpoint_every`` steps, at the end and on Ctrl-C;
    ``resume`` continues from it. ``memory_limit`` (with ``offload_dir``): the state in StarPU's tiles under
    that limit (``offload_io``: ``"buffered"`` or ``"direct"``, O_DIRECT). ``progress(step, loss, tokens_per_s,
    val_loss or None)`` is called after every step, ``log`` (default: print) with each line of news (validation,
    checkpoints)."""
    from tilecast.executor.memory_limit import MemoryLimit, parse_size
    from tilecast.training.loop import TrainOptions, train as train_loop

    cfg, tiling = _config(model), _tiling(tile)
    _shape(cfg, batch, seq)
    if offload_dir is not None and memory_limit is None:
        raise FieldError("offload_dir needs memory_limit")
    if offload_io != "buffered" and offload_dir is None:
        raise FieldError("offload_io needs offload_dir")
    memory = None if memory_limit is None else MemoryLimit(parse_size(memory_limit), offload_dir, offload_io)
    opts = TrainOptions(cfg=cfg, batch=batch, seq=seq, tiling=tiling, steps=steps, lr=lr, sched=sched,
                        workers=workers, eval_every=eval_every, eval_batches=eval_batches, checkpoint=checkpoint,
                        checkpoint_every=checkpoint_every, resume=resume, seed=seed, recompute=recompute,
                        memory=memory)
    r = train_loop(opts, progress=progress, log=log or print)
    return TrainResult(cfg.name, batch, seq, str(tiling), sched, len(r.workers), r.n_tasks, lr, r.step, r.start_step,
                       r.interrupted, r.diverged, list(r.losses), list(r.val), r.tokens_per_s, r.step_time_s,
                       r.wall_s, r.checkpoints[-1][1] if r.checkpoints else None, r.peak_rss_bytes, r)
