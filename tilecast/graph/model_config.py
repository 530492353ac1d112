"""GPT-2 model shapes: presets and user-given shapes, validated field by field."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

FIELDS = ("n_layer", "n_embd", "n_head", "vocab_size", "n_positions")


class ModelConfigError(ValueError):
    """A model shape that cannot be used; the message names the field."""


@dataclass(frozen=True)
class ModelConfig:
    n_layer: int
    n_embd: int
    n_head: int
    vocab_size: int
    n_positions: int
    name: str = "custom"
    layer_norm_epsilon: float = 1e-5

    def __post_init__(self):
        for f in FIELDS:
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ModelConfigError(f"model: {f} must be a whole number, got {v!r}")
            if v < 1:
                raise ModelConfigError(f"model: {f} must be at least 1, got {v}")
        if self.n_embd % self.n_head:
            raise ModelConfigError(
                f"model: n_embd ({self.n_embd}) is not divisible by n_head ({self.n_head})"
            )

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_inner(self) -> int:
        return 4 * self.n_embd

    def n_params(self) -> int:
        """Parameter count with the LM head tied to the token embedding."""
        e, v, p, l = self.n_embd, self.vocab_size, self.n_positions, self.n_layer
        per_layer = 2 * e + (3 * e * e + 3 * e) + (e * e + e) + 2 * e + (4 * e * e + 4 * e) + (4 * e * e + e)
        return v * e + p * e + l * per_layer + 2 * e

    def shape(self) -> dict:
        return {f: getattr(self, f) for f in FIELDS}

    def to_dict(self) -> dict:
        return asdict(self)


# GPT-2 shapes from Radford et al. 2019 (Table 2) and the Hugging Face model cards.
PRESETS = {
    "gpt2-tiny": dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=128),
    "gpt2": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024),
    "gpt2-medium": dict(n_layer=24, n_embd=1024, n_head=16, vocab_size=50257, n_positions=1024),
    "gpt2-large": dict(n_layer=36, n_embd=1280, n_head=20, vocab_size=50257, n_positions=1024),
    "gpt2-xl": dict(n_layer=48, n_embd=1600, n_head=25, vocab_size=50257, n_positions=1024),
}


def load_model(spec: str) -> ModelConfig:
    """A preset name, a JSON file, or an inline JSON object of the five shape fields."""
    spec = str(spec).strip()
    if spec in PRESETS:
        return ModelConfig(name=spec, **PRESETS[spec])
    if spec.startswith("{"):
        try:
            data = json.loads(spec)
        except json.JSONDecodeError as e:
            raise ModelConfigError(f"model: not valid JSON ({e.msg} at column {e.colno})") from None
        return from_dict(data, name="custom")
    if os.path.exists(spec):
        try:
            with open(spec) as f:
                data = json.load(f)
        except json.JSONDecodeError as e:
            raise ModelConfigError(f"model: {spec} is not valid JSON ({e.msg}, line {e.lineno})") from None
        return from_dict(data, name=os.path.splitext(os.path.basename(spec))[0])
    raise ModelConfigError(
        f"model: {spec!r} is neither a preset ({', '.join(PRESETS)}), a JSON file nor a JSON object"
    )


def from_dict(data, name: str = "custom") -> ModelConfig:
    if not isinstance(data, dict):
        raise ModelConfigError("model: expected a JSON object with " + ", ".join(FIELDS))
    missing = [f for f in FIELDS if f not in data]
    if missing:
        raise ModelConfigError(f"model: missing field {missing[0]}")
    unknown = sorted(set(data) - set(FIELDS) - {"name", "layer_norm_epsilon"})
    if unknown:
        raise ModelConfigError(f"model: unknown field {unknown[0]} (expected {', '.join(FIELDS)})")
    kwargs = {f: data[f] for f in FIELDS}
    return ModelConfig(name=data.get("name", name), **kwargs)
