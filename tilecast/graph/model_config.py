"""Model descriptions: presets and user-given shapes, validated field by field.

One description serves every command. Two families are known:

- ``gpt2``: LayerNorm, learned positions, 4x MLP with the tanh GELU, biases,
  LM head tied to the token embedding (Radford et al. 2019);
- ``llama``: RMSNorm, rotary position embedding (RoPE, Su et al. 2021),
  grouped-query attention (``n_kv_head`` key/value heads shared by groups of
  query heads, Ainslie et al. 2023), SwiGLU MLP (Shazeer 2020), no biases, LM
  head tied or not (Touvron et al. 2023).

The five shape fields (``FIELDS``) are required; the others default to the
family's values. A GPT-2 description is exactly what it was before families
existed: the five fields, optionally ``name`` and ``layer_norm_epsilon``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

FIELDS = ("n_layer", "n_embd", "n_head", "vocab_size", "n_positions")
FAMILIES = ("gpt2", "llama")
# What each family's computation is; a description may restate these but not change them.
FAMILY_FIXED = {
    "gpt2": dict(norm="layernorm", activation="gelu_tanh", position_embedding="learned", bias=True),
    "llama": dict(norm="rmsnorm", activation="swiglu", position_embedding="rope", bias=False),
}
FAMILY_DEFAULTS = {"gpt2": dict(tie_word_embeddings=True), "llama": dict(tie_word_embeddings=False)}
OPTIONAL = ("name", "family", "n_kv_head", "intermediate_size", "norm", "activation", "position_embedding",
            "tie_word_embeddings", "bias", "layer_norm_epsilon", "rope_theta", "rope_scaling")


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
    layer_norm_epsilon: float = 1e-5  # the normalisation's epsilon (LayerNorm or RMSNorm)
    family: str = "gpt2"
    n_kv_head: int | None = None  # key/value heads; None: n_head (multi-head attention)
    intermediate_size: int | None = None  # MLP inner size; None: 4 * n_embd
    norm: str | None = None
    activation: str | None = None
    position_embedding: str | None = None
    tie_word_embeddings: bool | None = None
    bias: bool | None = None
    rope_theta: float = 10000.0
    rope_scaling: str | None = None  # a long-context RoPE rescaling (e.g. "llama3"): shapes only, not modelled

    def __post_init__(self):
        for f in FIELDS:
            _whole(f, getattr(self, f))
        if self.family not in FAMILIES:
            raise ModelConfigError(f"model: family must be one of {', '.join(FAMILIES)}, got {self.family!r}")
        fam = self.family
        for f, v in {**FAMILY_FIXED[fam], **FAMILY_DEFAULTS[fam]}.items():
            if getattr(self, f) is None:
                object.__setattr__(self, f, v)
        for f, v in FAMILY_FIXED[fam].items():
            if getattr(self, f) != v:
                raise ModelConfigError(f"model: family {fam} has {f} {v!r}, got {getattr(self, f)!r}")
        if not isinstance(self.tie_word_embeddings, bool):
            raise ModelConfigError(f"model: tie_word_embeddings must be true or false, got {self.tie_word_embeddings!r}")
        if self.n_kv_head is None:
            object.__setattr__(self, "n_kv_head", self.n_head)
        if self.intermediate_size is None:
            object.__setattr__(self, "intermediate_size", 4 * self.n_embd)
        _whole("n_kv_head", self.n_kv_head)
        _whole("intermediate_size", self.intermediate_size)
        if self.n_embd % self.n_head:
            raise ModelConfigError(
                f"model: n_embd ({self.n_embd}) is not divisible by n_head ({self.n_head})"
            )
        if self.n_head % self.n_kv_head:
            raise ModelConfigError(
                f"model: n_head ({self.n_head}) is not divisible by n_kv_head ({self.n_kv_head})")
        if fam == "gpt2":
            if self.n_kv_head != self.n_head:
                raise ModelConfigError("model: family gpt2 has n_kv_head equal to n_head")
            if not self.tie_word_embeddings:
                raise ModelConfigError("model: family gpt2 ties the LM head to the token embedding")
        if self.position_embedding == "rope" and self.head_dim % 2:
            raise ModelConfigError(f"model: RoPE needs an even head size, got {self.head_dim}")
        if not (isinstance(self.layer_norm_epsilon, (int, float)) and self.layer_norm_epsilon > 0):
            raise ModelConfigError(f"model: layer_norm_epsilon must be positive, got {self.layer_norm_epsilon!r}")
        if not (isinstance(self.rope_theta, (int, float)) and self.rope_theta > 0):
            raise ModelConfigError(f"model: rope_theta must be positive, got {self.rope_theta!r}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_inner(self) -> int:
        return self.intermediate_size

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (1 without grouped-query attention)."""
        return self.n_head // self.n_kv_head

    def n_params(self) -> int:
        """Parameter count (an untied LM head counted once more)."""
        e, v, p, l, i = self.n_embd, self.vocab_size, self.n_positions, self.n_layer, self.n_inner
        if self.family == "gpt2":
            per_layer = 2 * e + (3 * e * e + 3 * e) + (e * e + e) + 2 * e + (e * i + i) + (i * e + e)
            return v * e + p * e + l * per_layer + 2 * e
        kv = self.n_kv_head * self.head_dim
        per_layer = 2 * e + e * e + 2 * e * kv + e * e + 3 * e * i
        return v * e * (1 if self.tie_word_embeddings else 2) + l * per_layer + e

    def shape(self) -> dict:
        """The fields that set the model's shape: the five of GPT-2, plus the Llama ones for that family."""
        out = {f: getattr(self, f) for f in FIELDS}
        if self.family != "gpt2" or self.intermediate_size != 4 * self.n_embd:
            out.update(family=self.family, n_kv_head=self.n_kv_head, intermediate_size=self.intermediate_size,
                       tie_word_embeddings=self.tie_word_embeddings)
        return out

    def to_dict(self) -> dict:
        return asdict(self)


def _whole(f, v):
    if not isinstance(v, int) or isinstance(v, bool):
        raise ModelConfigError(f"model: {f} must be a whole number, got {v!r}")
    if v < 1:
        raise ModelConfigError(f"model: {f} must be at least 1, got {v}")


# GPT-2 shapes from Radford et al. 2019 (Table 2) and the Hugging Face model cards.
PRESETS = {
    "gpt2-tiny": dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=128),
    "gpt2": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024),
    "gpt2-medium": dict(n_layer=24, n_embd=1024, n_head=16, vocab_size=50257, n_positions=1024),
    "gpt2-large": dict(n_layer=36, n_embd=1280, n_head=20, vocab_size=50257, n_positions=1024),
    "gpt2-xl": dict(n_layer=48, n_embd=1600, n_head=25, vocab_size=50257, n_positions=1024),
    # A Llama for tests: grouped-query attention (2 query heads per KV head), an inner size
    # that is not 4x, an untied head.
    "llama-tiny": dict(family="llama", n_layer=2, n_embd=64, n_head=4, n_kv_head=2, intermediate_size=176,
                       vocab_size=256, n_positions=128),
    # Shapes from the models' config.json on the Hugging Face Hub:
    # HuggingFaceTB/SmolLM2-135M/config.json (hidden_size 576, 30 layers, 9 heads, 3 KV heads,
    # intermediate_size 1536, vocab 49152, 8192 positions, rms_norm_eps 1e-5, rope_theta 100000, tied).
    "smollm2-135m": dict(family="llama", n_layer=30, n_embd=576, n_head=9, n_kv_head=3, intermediate_size=1536,
                         vocab_size=49152, n_positions=8192, layer_norm_epsilon=1e-5, rope_theta=100000.0,
                         tie_word_embeddings=True),
    # TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T/config.json (hidden_size 2048, 22 layers,
    # 32 heads, 4 KV heads, intermediate_size 5632, vocab 32000, 2048 positions, rms_norm_eps 1e-5,
    # rope_theta 10000, untied).
    "tinyllama-1.1b": dict(family="llama", n_layer=22, n_embd=2048, n_head=32, n_kv_head=4, intermediate_size=5632,
                           vocab_size=32000, n_positions=2048, layer_norm_epsilon=1e-5, rope_theta=10000.0,
                           tie_word_embeddings=False),
    # meta-llama/Llama-3.2-1B/config.json (hidden_size 2048, 16 layers, 32 heads, 8 KV heads,
    # intermediate_size 8192, vocab 128256, 131072 positions, rms_norm_eps 1e-5, rope_theta 500000,
    # rope_scaling "llama3", tied).
    "llama-3.2-1b": dict(family="llama", n_layer=16, n_embd=2048, n_head=32, n_kv_head=8, intermediate_size=8192,
                         vocab_size=128256, n_positions=131072, layer_norm_epsilon=1e-5, rope_theta=500000.0,
                         rope_scaling="llama3", tie_word_embeddings=True),
}


def load_model(spec: str) -> ModelConfig:
    """A preset name, a JSON file (tilecast's fields, or a transformers config.json; a folder holding
    one), or an inline JSON object."""
    spec = str(spec).strip()
    if spec in PRESETS:
        return ModelConfig(name=spec, **PRESETS[spec])
    if spec.startswith("{"):
        try:
            data = json.loads(spec)
        except json.JSONDecodeError as e:
            raise ModelConfigError(f"model: not valid JSON ({e.msg} at column {e.colno})") from None
        return from_dict(data, name="custom")
    path = os.path.join(spec, "config.json") if os.path.isdir(spec) else spec
    if os.path.isfile(path):
        try:
            with open(path) as f:
                data = json.load(f)
        except json.JSONDecodeError as e:
            raise ModelConfigError(f"model: {path} is not valid JSON ({e.msg}, line {e.lineno})") from None
        stem = os.path.splitext(os.path.basename(path))[0]
        if stem == "config":  # transformers' layout: the folder names the model
            stem = os.path.basename(os.path.dirname(os.path.abspath(path))) or stem
        return from_dict(data, name=stem)
    raise ModelConfigError(
        f"model: {spec!r} is neither a preset ({', '.join(PRESETS)}), a JSON file nor a JSON object"
    )


def from_dict(data, name: str = "custom") -> ModelConfig:
    if not isinstance(data, dict):
        raise ModelConfigError("model: expected a JSON object with " + ", ".join(FIELDS))
    if "model_type" in data:
        return from_transformers(data, name)
    missing = [f for f in FIELDS if f not in data]
    if missing:
        raise ModelConfigError(f"model: missing field {missing[0]}")
    unknown = sorted(set(data) - set(FIELDS) - set(OPTIONAL))
    if unknown:
        raise ModelConfigError(f"model: unknown field {unknown[0]} (expected {', '.join(FIELDS + OPTIONAL[1:])})")
    kwargs = {f: data[f] for f in FIELDS + OPTIONAL if f in data and f != "name"}
    return ModelConfig(name=data.get("name", name), **kwargs)


def from_transformers(data: dict, name: str = "custom") -> ModelConfig:
    """A transformers ``config.json`` (model_type ``gpt2`` or ``llama``) as a model description.

    Fields that change the computation beyond what tilecast builds (biases in a
    Llama, another activation, a head size other than n_embd / n_head) are refused
    with the field named.
    """
    kind = data.get("model_type")

    def need(key):
        if key not in data:
            raise ModelConfigError(f"model: config.json ({kind}) has no {key}")
        return data[key]

    if kind == "gpt2":
        act = data.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ModelConfigError(f"model: activation_function {act!r} is not supported (gelu_new)")
        return ModelConfig(name=name, n_layer=need("n_layer"), n_embd=need("n_embd"), n_head=need("n_head"),
                           vocab_size=need("vocab_size"), n_positions=need("n_positions"),
                           layer_norm_epsilon=float(data.get("layer_norm_epsilon", 1e-5)),
                           intermediate_size=data.get("n_inner") or None)
    if kind == "llama":
        act = data.get("hidden_act", "silu")
        if act != "silu":
            raise ModelConfigError(f"model: hidden_act {act!r} is not supported (silu)")
        for key in ("attention_bias", "mlp_bias"):
            if data.get(key):
                raise ModelConfigError(f"model: {key} true is not supported (Llama without biases)")
        heads, hidden = need("num_attention_heads"), need("hidden_size")
        if data.get("head_dim") not in (None, hidden // heads):
            raise ModelConfigError(f"model: head_dim {data['head_dim']} differs from hidden_size / num_attention_heads")
        rope = data.get("rope_parameters") or {}
        theta = data.get("rope_theta", rope.get("rope_theta", 10000.0))
        scaling = data.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        scaling_type = None
        if scaling:
            scaling_type = scaling.get("rope_type") or scaling.get("type") or "custom"
        return ModelConfig(name=name, family="llama", n_layer=need("num_hidden_layers"), n_embd=hidden,
                           n_head=heads, n_kv_head=data.get("num_key_value_heads") or heads,
                           intermediate_size=need("intermediate_size"), vocab_size=need("vocab_size"),
                           n_positions=need("max_position_embeddings"),
                           layer_norm_epsilon=float(data.get("rms_norm_eps", 1e-6)), rope_theta=float(theta),
                           rope_scaling=scaling_type,
                           tie_word_embeddings=bool(data.get("tie_word_embeddings", False)))
    raise ModelConfigError(f"model: config.json model_type {kind!r} is not supported (gpt2, llama)")
