"""What every ``tc.*`` result shares (``to_frame()``, ``to_dict()``, an HTML view) and the argument readers
the entry points share (a model, a tiling, a whole number, a batch and sequence); also ``tc.model``."""

from __future__ import annotations

import dataclasses
import html
from dataclasses import dataclass, field

from tilecast.errors import FieldError

class _Result:
    """What every result offers: ``to_frame()`` (subclasses), ``to_dict()`` and an HTML view."""

    _title = ""

    def to_frame(self):  # pragma: no cover - every result defines it
        raise NotImplementedError

    def to_dict(self) -> dict:
        """The typed fields as JSON-ready values (objects such as graphs and traces left out)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.repr}

    def _headline(self) -> str:
        return self._title

    def _repr_html_(self) -> str:
        frame = self.to_frame()
        table = frame.to_html(max_rows=30, float_format=lambda x: f"{x:.6g}", index=False)
        return f"<p><b>{html.escape(self._headline())}</b></p>{table}"


def _config(spec):
    """A ModelConfig from a preset name, JSON object/file, ModelConfig or ModelResult."""
    from tilecast.graph.model_config import ModelConfig, load_model

    if isinstance(spec, ModelResult):
        return spec.config
    if isinstance(spec, ModelConfig):
        return spec
    if isinstance(spec, dict):
        import json

        spec = json.dumps(spec)
    return load_model(spec)


def _tiling(tile):
    """A Tiling from ``"256"``, ``"seq=128,embd=256"``, an int, a {dim: size} dict, a Tiling or None (untiled)."""
    from tilecast.graph import Tiling

    if isinstance(tile, Tiling):
        return tile
    if isinstance(tile, dict):
        return Tiling(dict(tile))
    return Tiling.parse(None if tile is None else str(tile))


def _positive(name: str, value, low: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise FieldError(f"{name} must be a whole number of at least {low}, got {value!r}")
    return value


def _at_least(name: str, value, low: int) -> None:
    """FieldError "name must be at least low, got value" unless ``value`` is a whole number >= ``low``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise FieldError(f"{name} must be at least {low}, got {value!r}")


def _shape(cfg, batch, seq) -> None:
    _positive("batch", batch)
    _positive("seq", seq)
    if seq > cfg.n_positions:
        raise FieldError(f"seq {seq} exceeds the model's n_positions ({cfg.n_positions})")


# --- model -------------------------------------------------------------------------------------------------
@dataclass
class ModelResult(_Result):
    """A GPT model's shape (``config`` is the :class:`tilecast.graph.model_config.ModelConfig`)."""

    name: str
    n_layer: int
    n_embd: int
    n_head: int
    vocab_size: int
    n_positions: int
    params: int
    config: object = field(repr=False, default=None)
    _title = "model"

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([self.to_dict()])

    def _headline(self) -> str:
        return f"{self.name}: {self.params / 1e6:.1f} M parameters"


def model(spec="gpt2") -> ModelResult:
    """A model shape: a preset (``gpt2-tiny``, ``gpt2``, ... ``gpt2-xl``), a JSON file, or a JSON object/dict of
    ``n_layer``, ``n_embd``, ``n_head``, ``vocab_size``, ``n_positions``."""
    cfg = _config(spec)
    return ModelResult(cfg.name, cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab_size, cfg.n_positions,
                       int(cfg.n_params()), cfg)
