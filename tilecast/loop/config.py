"""One configuration of a training step: what the loop simulates, ranks, executes and compares."""

from __future__ import annotations

from dataclasses import dataclass

from tilecast.graph import Tiling
from tilecast.graph.model_config import ModelConfig


@dataclass(frozen=True)
class StepConfig:
    """A model, a batch and sequence length, a tiling, a StarPU scheduler, a worker count and the step's
    activation recompute setting (:mod:`tilecast.graph.recompute`)."""

    model: ModelConfig
    batch: int
    seq: int
    tiling: Tiling
    sched: str
    workers: int
    recompute: str = "none"

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def label(self) -> str:
        """``gpt2-5h 6x100 tile 80 lws w2``: the tiling as tune's tables show it (``--tile`` reads it back)."""
        from tilecast.loop.candidates import short_label

        rc = "" if self.recompute == "none" else f" recompute {self.recompute}"
        return (f"{self.model.name} {self.batch}x{self.seq} tile {short_label(self.tiling)}{rc} {self.sched} "
                f"w{self.workers}")

    def to_dict(self) -> dict:
        return {"model": self.model.name, "batch": self.batch, "seq": self.seq, "tiling": self.tiling.describe(),
                "sched": self.sched, "workers": self.workers, "recompute": self.recompute}

    @property
    def graph_key(self) -> tuple:
        """What determines the task graph (not the scheduler nor the workers): configurations with equal keys
        run the same tasks on the same tile shapes."""
        return (self.model.name, self.batch, self.seq, self.tiling.describe(), self.recompute)

    @property
    def graph_id(self) -> str:
        """:attr:`graph_key` as one string (a key of what is learned per task graph and stored in JSON)."""
        return "|".join(str(x) for x in self.graph_key)

    def build(self):
        """The step's task graph (GPT-2 or Llama)."""
        from tilecast.graph.models import build_step

        return build_step(self.model, self.batch, self.seq, self.tiling, recompute=self.recompute)
