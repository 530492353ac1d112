"""Model descriptions: presets and user-given shapes, validated field by field.

One description serves every command. Three families are known:

- ``gpt2``: LayerNorm, learned positions, 4x MLP with the tanh GELU, biases,
  LM head tied to the token embedding (Radford et al. 2019);
- ``llama``: RMSNorm, rotary position embedding (RoPE, Su et al. 2021),
  grouped-query attention (``n_kv_head`` key/value heads shared by groups of
  query heads, Ainslie et al. 2023), SwiGLU MLP (Shazeer 2020), no biases, LM
  head tied or not (Touvron et al. 2023);
- ``decoder``: any other decoder-only transformer, its computation given field
  by field (``norm``, ``activation``, ``position_embedding`` learned / rope /
  alibi, ``bias``), e.g. MPT and BLOOM (LayerNorm, GELU, ALiBi). Only the
  cluster what-if models it; the tile graphs build gpt2 and llama.

A mixture of experts (``n_experts`` > 0, Shazeer et al. 2017) replaces the MLP
of every layer after the first ``n_dense_layers`` by ``n_experts`` routed MLPs
of inner size ``expert_intermediate_size``, ``n_experts_per_token`` of them per
token (top-k), plus ``n_shared_experts`` MLPs every token goes through
(DeepSeekMoE, Dai et al. 2024). Only the cluster what-if models experts.

``head_dim`` (default n_embd / n_head) sets the width of one attention head;
Qwen3 and GPT-OSS have n_head x head_dim != n_embd. Only the cluster what-if
models such heads; the tile graphs refuse them.

The five shape fields (``FIELDS``) are required; the others default to the
family's values. A GPT-2 description is exactly what it was before families
existed: the five fields, optionally ``name`` and ``layer_norm_epsilon``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from tilecast.graph.presets import PRESETS  # the one table of named shapes  # noqa: F401

FIELDS = ("n_layer", "n_embd", "n_head", "vocab_size", "n_positions")
FAMILIES = ("gpt2", "llama", "decoder")
TILED_FAMILIES = ("gpt2", "llama")  # what the tile graphs build
NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("gelu_tanh", "gelu", "swiglu")
POSITIONS = ("learned", "rope", "alibi")
# What each family's computation is; a description may restate these but not change them.
FAMILY_FIXED = {
    "gpt2": dict(norm="layernorm", activation="gelu_tanh", position_embedding="learned", bias=True),
    "llama": dict(norm="rmsnorm", activation="swiglu", position_embedding="rope", bias=False),
    "decoder": {},
}
FAMILY_DEFAULTS = {"gpt2": dict(tie_word_embeddings=True), "llama": dict(tie_word_embeddings=False),
                   "decoder": dict(norm="layernorm", activation="gelu", position_embedding="learned", bias=True,
                                   tie_word_embeddings=True)}
# transformers' rope_scaling keys: factor, low_freq_factor, high_freq_factor, original_max_position_embeddings.
ROPE_SCALING_FIELDS = ("rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_positions")
# The RoPE scalings the tile kernels apply numerically, with the fields each needs ("dynamic" NTK scaling only
# changes the frequencies beyond n_positions, which no step reaches: its frequencies are the unscaled ones).
NUMERIC_ROPE_SCALING = {"linear": ("rope_factor",), "dynamic": ("rope_factor",),
                        "llama3": ROPE_SCALING_FIELDS}
MOE_FIELDS = ("n_experts", "n_experts_per_token", "expert_intermediate_size", "n_shared_experts", "n_dense_layers")
OPTIONAL = ("name", "family", "n_kv_head", "head_dim", "intermediate_size", "norm", "activation", "position_embedding",
            "tie_word_embeddings", "bias", "layer_norm_epsilon", "rope_theta", "rope_scaling"
            ) + ROPE_SCALING_FIELDS + MOE_FIELDS


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
    head_dim: int | None = None  # width of one attention head; None: n_embd / n_head (Qwen3, GPT-OSS differ)
    intermediate_size: int | None = None  # MLP inner size; None: 4 * n_embd
    norm: str | None = None
    activation: str | None = None
    position_embedding: str | None = None
    tie_word_embeddings: bool | None = None
    bias: bool | None = None
    rope_theta: float = 10000.0
    rope_scaling: str | None = None  # a long-context RoPE rescaling, transformers' rope_type ("llama3", "linear")
    rope_factor: float | None = None  # how much longer the context is than in pretraining (linear, llama3)
    rope_low_freq_factor: float | None = None  # llama3: wavelengths above original / this are divided by factor
    rope_high_freq_factor: float | None = None  # llama3: wavelengths below original / this are kept
    rope_original_positions: int | None = None  # llama3: the pretraining context (original_max_position_embeddings)
    n_experts: int = 0  # routed experts per MoE layer (0: a dense model)
    n_experts_per_token: int = 0  # routed experts each token goes to (top-k); 0 without experts
    expert_intermediate_size: int | None = None  # one expert's MLP inner size; None: intermediate_size
    n_shared_experts: int = 0  # experts every token goes through (DeepSeekMoE), of the experts' inner size
    n_dense_layers: int = 0  # leading layers with a dense MLP instead of experts (DeepSeek's first_k_dense_replace)

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
        for f, allowed in (("norm", NORMS), ("activation", ACTIVATIONS), ("position_embedding", POSITIONS)):
            if getattr(self, f) not in allowed:
                raise ModelConfigError(f"model: {f} must be one of {', '.join(allowed)}, got {getattr(self, f)!r}")
        if not isinstance(self.bias, bool):
            raise ModelConfigError(f"model: bias must be true or false, got {self.bias!r}")
        if not isinstance(self.tie_word_embeddings, bool):
            raise ModelConfigError(f"model: tie_word_embeddings must be true or false, got {self.tie_word_embeddings!r}")
        if self.n_kv_head is None:
            object.__setattr__(self, "n_kv_head", self.n_head)
        if self.intermediate_size is None:
            object.__setattr__(self, "intermediate_size", 4 * self.n_embd)
        _whole("n_kv_head", self.n_kv_head)
        _whole("intermediate_size", self.intermediate_size)
        if self.head_dim is None:
            if self.n_embd % self.n_head:
                raise ModelConfigError(
                    f"model: n_embd ({self.n_embd}) is not divisible by n_head ({self.n_head})"
                )
            object.__setattr__(self, "head_dim", self.n_embd // self.n_head)
        _whole("head_dim", self.head_dim)
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
        self._check_experts()
        if not (isinstance(self.layer_norm_epsilon, (int, float)) and self.layer_norm_epsilon > 0):
            raise ModelConfigError(f"model: layer_norm_epsilon must be positive, got {self.layer_norm_epsilon!r}")
        if not (isinstance(self.rope_theta, (int, float)) and self.rope_theta > 0):
            raise ModelConfigError(f"model: rope_theta must be positive, got {self.rope_theta!r}")
        self._check_rope_scaling()

    def _check_rope_scaling(self):
        if self.rope_scaling is not None and not (isinstance(self.rope_scaling, str) and self.rope_scaling):
            raise ModelConfigError(f"model: rope_scaling must be a rope_type name, got {self.rope_scaling!r}")
        for f in ROPE_SCALING_FIELDS:
            v = getattr(self, f)
            if v is None:
                continue
            if self.rope_scaling is None:
                raise ModelConfigError(f"model: {f} needs rope_scaling")
            if f == "rope_original_positions":
                _whole(f, v)
            elif not (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0):
                raise ModelConfigError(f"model: {f} must be positive, got {v!r}")
        if self.rope_factor is not None and self.rope_factor < 1:
            raise ModelConfigError(f"model: rope_factor must be at least 1, got {self.rope_factor!r}")
        lo, hi = self.rope_low_freq_factor, self.rope_high_freq_factor
        if lo is not None and hi is not None and not lo < hi:
            raise ModelConfigError(f"model: rope_low_freq_factor ({lo}) must be below rope_high_freq_factor ({hi})")

    def _check_experts(self):
        for f in ("n_experts", "n_experts_per_token", "n_shared_experts", "n_dense_layers"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ModelConfigError(f"model: {f} must be a whole number >= 0, got {v!r}")
        if not self.n_experts:
            for f in ("n_experts_per_token", "n_shared_experts", "n_dense_layers"):
                if getattr(self, f):
                    raise ModelConfigError(f"model: {f} needs n_experts >= 1")
            if self.expert_intermediate_size is not None:
                raise ModelConfigError("model: expert_intermediate_size needs n_experts >= 1")
            return
        if not 1 <= self.n_experts_per_token <= self.n_experts:
            raise ModelConfigError(f"model: n_experts_per_token must be between 1 and n_experts ({self.n_experts}), "
                                   f"got {self.n_experts_per_token}")
        if self.n_dense_layers >= self.n_layer:
            raise ModelConfigError(f"model: n_dense_layers ({self.n_dense_layers}) leaves no expert layer of "
                                   f"{self.n_layer}")
        if self.expert_intermediate_size is None:
            object.__setattr__(self, "expert_intermediate_size", self.intermediate_size)
        _whole("expert_intermediate_size", self.expert_intermediate_size)

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def n_moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts."""
        return self.n_layer - self.n_dense_layers if self.is_moe else 0

    @property
    def gated_mlp(self) -> bool:
        """SwiGLU: three n_embd x inner matrices per MLP instead of two."""
        return self.activation == "swiglu"

    @property
    def kv_dim(self) -> int:
        return self.n_kv_head * self.head_dim

    @property
    def q_dim(self) -> int:
        """Width of the queries (and of the attention output before its projection): n_head x head_dim."""
        return self.n_head * self.head_dim

    @property
    def default_head_dim(self) -> bool:
        """Heads as wide as n_embd / n_head, which the tile graphs assume."""
        return self.q_dim == self.n_embd

    @property
    def learned_positions(self) -> int:
        """Rows of the learned position table (0 with RoPE or ALiBi)."""
        return self.n_positions if self.position_embedding == "learned" else 0

    def tiled_error(self) -> str | None:
        """Why the tile graphs cannot build this model (one line naming it), or None when they can."""
        if self.family not in TILED_FAMILIES:
            return (f"model: {self.name} is a {self.family} model ({self.norm}, {self.activation}, "
                    f"{self.position_embedding} positions), which the tile graphs do not build (families "
                    f"{', '.join(TILED_FAMILIES)}); tilecast whatif models it")
        if self.is_moe:
            return (f"model: {self.name} is a mixture of experts ({self.n_experts} experts), which the tile graphs "
                    f"do not build; tilecast whatif models it")
        if not self.default_head_dim:
            return (f"model: {self.name} has head_dim {self.head_dim} (n_head x head_dim = {self.q_dim}, not n_embd "
                    f"{self.n_embd}), which the tile graphs do not build; tilecast whatif models it")
        return None

    def check_batch_seq(self, batch: int, seq: int) -> None:
        """FieldError unless ``batch`` and ``seq`` are positive and ``seq`` fits the model's positions."""
        from tilecast.errors import FieldError

        if batch < 1:
            raise FieldError(f"batch must be at least 1, got {batch}")
        if seq < 1:
            raise FieldError(f"seq must be at least 1, got {seq}")
        if seq > self.n_positions:
            raise FieldError(f"seq {seq} exceeds the model's n_positions ({self.n_positions})")

    def numeric_error(self) -> str | None:
        """Why the tile kernels cannot train this model as transformers would (one line), or None.

        Shapes and costs do not depend on it (graph, simulate and tune model such a model); the numbers do."""
        if self.rope_scaling and self.rope_scaling not in NUMERIC_ROPE_SCALING:
            return (f"model: {self.name} rescales its rotary embedding with rope_type {self.rope_scaling!r}, which "
                    f"the tile kernels do not apply (they apply {', '.join(NUMERIC_ROPE_SCALING)}); graph, simulate "
                    f"and tune model its steps")
        for f in NUMERIC_ROPE_SCALING.get(self.rope_scaling, ()):
            if getattr(self, f) is None:
                return f"model: {self.name}'s {self.rope_scaling!r} RoPE scaling needs {f}"
        return None

    def check_tiled(self) -> "ModelConfig":
        """Raise ModelConfigError unless the tile graphs build this model."""
        err = self.tiled_error()
        if err:
            raise ModelConfigError(err)
        return self

    @property
    def n_inner(self) -> int:
        return self.intermediate_size

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (1 without grouped-query attention)."""
        return self.n_head // self.n_kv_head

    def mlp_params(self, inner: int) -> int:
        """One MLP (or one expert) of inner size ``inner``: its matrices and, with ``bias``, their biases."""
        e, b = self.n_embd, int(self.bias)
        mats = 3 if self.gated_mlp else 2
        return mats * e * inner + b * ((mats - 1) * inner + e)

    def n_params(self, active: bool = False) -> int:
        """Parameter count (an untied LM head counted once more); ``active``: with only the experts one
        token goes through (top-k routed plus shared)."""
        e, v, l = self.n_embd, self.vocab_size, self.n_layer
        b, kv, q = int(self.bias), self.kv_dim, self.q_dim
        norm = 2 * e if self.norm == "layernorm" else e
        attn = e * (q + 2 * kv) + b * (q + 2 * kv) + q * e + b * e
        dense = attn + 2 * norm + self.mlp_params(self.n_inner)
        total = v * e * (1 if self.tie_word_embeddings else 2) + self.learned_positions * e + norm
        total += (l - self.n_moe_layers) * dense
        if self.is_moe:
            routed = self.n_experts_per_token if active else self.n_experts
            moe = attn + 2 * norm + e * self.n_experts + (routed + self.n_shared_experts) * self.mlp_params(
                self.expert_intermediate_size)
            total += self.n_moe_layers * moe
        return total

    def shape(self) -> dict:
        """The fields that set the model's shape: the five of GPT-2, plus the Llama ones for that family."""
        out = {f: getattr(self, f) for f in FIELDS}
        if self.family != "gpt2" or self.intermediate_size != 4 * self.n_embd:
            out.update(family=self.family, n_kv_head=self.n_kv_head, intermediate_size=self.intermediate_size,
                       tie_word_embeddings=self.tie_word_embeddings)
        if not self.default_head_dim:
            out.update(head_dim=self.head_dim)
        if self.family == "decoder":
            out.update(norm=self.norm, activation=self.activation, position_embedding=self.position_embedding,
                       bias=self.bias)
        if self.is_moe:
            out.update({f: getattr(self, f) for f in MOE_FIELDS})
        return out

    def to_dict(self) -> dict:
        """The fields; ``head_dim`` only where it differs from n_embd / n_head (descriptions, graph metadata and
        fingerprints of other models stay as they were before the field existed)."""
        out = asdict(self)
        if self.default_head_dim:
            del out["head_dim"]
        for f in ROPE_SCALING_FIELDS:  # likewise the scaling's parameters, kept only where set
            if out[f] is None:
                del out[f]
        return out


def _whole(f, v):
    if not isinstance(v, int) or isinstance(v, bool):
        raise ModelConfigError(f"model: {f} must be a whole number, got {v!r}")
    if v < 1:
        raise ModelConfigError(f"model: {f} must be at least 1, got {v}")


def load_model(spec) -> ModelConfig:
    """A preset name, a JSON file (tilecast's fields, or a transformers config.json; a folder holding
    one), an inline JSON object, or a ModelConfig (returned as it is)."""
    if isinstance(spec, ModelConfig):
        return spec
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
    """A transformers ``config.json`` (model_type ``gpt2``, ``llama``, ``mixtral``, ``qwen3_moe`` or
    ``gpt_oss``) as a model description.

    Fields that change the computation beyond what tilecast describes (biases in a
    Llama, another activation) are refused with the field named. A ``head_dim``
    other than hidden_size / num_attention_heads is kept (the cluster what-if
    models it; the tile graphs refuse it, :meth:`ModelConfig.tiled_error`).
    Qwen3's per-head query/key norms and GPT-OSS's sliding-window layers and
    attention sinks are not described (shapes only). ``rope_scaling`` (or a
    scaled ``rope_parameters``) gives ``rope_scaling`` its rope_type and, for the
    types the kernels apply (``NUMERIC_ROPE_SCALING``), the ``rope_*`` fields.
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
    if kind in ("llama", "mixtral", "qwen3_moe", "gpt_oss"):
        act = data.get("hidden_act", "silu")
        if act != "silu":
            raise ModelConfigError(f"model: hidden_act {act!r} is not supported (silu)")
        if kind != "gpt_oss":  # GPT-OSS has attention and expert biases: a decoder-family description
            for key in ("attention_bias", "mlp_bias"):
                if data.get(key):
                    raise ModelConfigError(f"model: {key} true is not supported (Llama without biases)")
        if kind == "qwen3_moe":
            if data.get("mlp_only_layers") or data.get("decoder_sparse_step", 1) != 1:
                raise ModelConfigError("model: qwen3_moe with dense layers (mlp_only_layers, decoder_sparse_step) "
                                       "is not supported")
        heads, hidden = need("num_attention_heads"), need("hidden_size")
        rope = data.get("rope_parameters") or {}
        theta = data.get("rope_theta", rope.get("rope_theta", 10000.0))
        scaling = data.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        scaling_type, scaling_fields = None, {}
        if scaling:
            scaling_type = scaling.get("rope_type") or scaling.get("type") or "custom"
            keys = dict(zip(ROPE_SCALING_FIELDS, ("factor", "low_freq_factor", "high_freq_factor",
                                                  "original_max_position_embeddings")))
            scaling_fields = {f: scaling[k] for f, k in keys.items() if scaling.get(k) is not None}
            # only the fields the kernels use (other scalings are described by their name alone)
            used = NUMERIC_ROPE_SCALING.get(scaling_type, ())
            scaling_fields = {f: v for f, v in scaling_fields.items() if f in used}
        experts = {"mixtral": lambda: dict(n_experts=need("num_local_experts"),
                                           n_experts_per_token=need("num_experts_per_tok")),
                   "gpt_oss": lambda: dict(n_experts=need("num_local_experts"),
                                           n_experts_per_token=need("num_experts_per_tok")),
                   "qwen3_moe": lambda: dict(n_experts=need("num_experts"), n_experts_per_token=need("num_experts_per_tok"),
                                             expert_intermediate_size=need("moe_intermediate_size"))}
        family = (dict(family="decoder", norm="rmsnorm", activation="swiglu", position_embedding="rope", bias=True)
                  if kind == "gpt_oss" else dict(family="llama"))
        return ModelConfig(name=name, **family, n_layer=need("num_hidden_layers"), n_embd=hidden,
                           n_head=heads, n_kv_head=data.get("num_key_value_heads") or heads,
                           head_dim=data.get("head_dim") or None,
                           intermediate_size=need("intermediate_size"), vocab_size=need("vocab_size"),
                           n_positions=need("max_position_embeddings"),
                           layer_norm_epsilon=float(data.get("rms_norm_eps", 1e-6)), rope_theta=float(theta),
                           rope_scaling=scaling_type, **scaling_fields,
                           tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
                           **(experts[kind]() if kind in experts else {}))
    raise ModelConfigError(f"model: config.json model_type {kind!r} is not supported (gpt2, llama, mixtral, qwen3_moe, gpt_oss)")
