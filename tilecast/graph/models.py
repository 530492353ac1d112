"""The training step of any model family: one entry point for commands that take a ``--model``."""

from __future__ import annotations

from tilecast.graph.graph import Graph
from tilecast.graph.model_config import ModelConfig


def build_step(cfg: ModelConfig, batch: int, seq: int, tiling=None, adamw=None, step: int = 1, **kw) -> Graph:
    """The task graph of one training step of ``cfg`` (GPT-2 or Llama; others: ModelConfigError)."""
    cfg.check_tiled()
    if cfg.family == "llama":
        from tilecast.graph.llama import build_llama_step

        return build_llama_step(cfg, batch, seq, tiling, adamw, step, **kw)
    from tilecast.graph.gpt2 import build_gpt2_step

    return build_gpt2_step(cfg, batch, seq, tiling, adamw, step, **kw)


def build_forward(cfg: ModelConfig, batch: int, seq: int, tiling=None, **kw) -> Graph:
    """The forward pass and loss of ``cfg`` (evaluation)."""
    cfg.check_tiled()
    if cfg.family == "llama":
        from tilecast.graph.llama import build_llama_forward

        return build_llama_forward(cfg, batch, seq, tiling, **kw)
    from tilecast.graph.gpt2 import build_gpt2_forward

    return build_gpt2_forward(cfg, batch, seq, tiling, **kw)


def model_parameters(cfg: ModelConfig) -> dict:
    """Parameter name -> (shape, tiling dims) of ``cfg``'s family."""
    cfg.check_tiled()
    if cfg.family == "llama":
        from tilecast.graph.llama import llama_parameters

        return llama_parameters(cfg)
    from tilecast.graph.gpt2 import gpt2_parameters

    return gpt2_parameters(cfg)
