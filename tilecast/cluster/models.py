"""Transformer shapes for cluster-scale what-ifs.

GPT-2 presets and shapes come from :func:`tilecast.graph.model_config.load_model`;
this module adds the larger GPT-3-style shapes the validation runs need, and
the few fields those need beyond GPT-2 (FFN width, grouped-query attention,
gated MLPs, untied embeddings).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from tilecast.graph.model_config import FIELDS as GPT2_FIELDS
from tilecast.graph.model_config import ModelConfigError, load_model


@dataclass(frozen=True)
class Shape:
    name: str
    n_layer: int
    d_model: int
    n_head: int
    vocab: int
    d_ff: int = 0  # 0: 4 * d_model
    n_kv_head: int = 0  # 0: n_head (multi-head attention)
    gated_mlp: bool = False  # SwiGLU-style: three d_model x d_ff matrices instead of two
    tied_embeddings: bool = True
    learned_positions: int = 0  # rows of a learned position table (0: none, e.g. ALiBi/RoPE)

    def __post_init__(self):
        for f in ("n_layer", "d_model", "n_head", "vocab"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ModelConfigError(f"model: {f} must be a whole number >= 1, got {v!r}")
        if self.d_model % self.n_head:
            raise ModelConfigError(f"model: d_model ({self.d_model}) is not divisible by n_head ({self.n_head})")
        if self.kv_heads < 1 or self.n_head % self.kv_heads:
            raise ModelConfigError(f"model: n_head ({self.n_head}) is not divisible by n_kv_head ({self.kv_heads})")

    @property
    def ff(self) -> int:
        return self.d_ff or 4 * self.d_model

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def layer_params(self) -> int:
        """Weights and biases of one block: attention, MLP, two layer norms."""
        h, f = self.d_model, self.ff
        attn = h * (h + 2 * self.kv_dim) + (h + 2 * self.kv_dim) + h * h + h
        mlp = (3 if self.gated_mlp else 2) * h * f + f + h
        return attn + mlp + 4 * h

    def embedding_params(self) -> int:
        return self.vocab * self.d_model + self.learned_positions * self.d_model

    def n_params(self) -> int:
        head = 0 if self.tied_embeddings else self.vocab * self.d_model
        return self.n_layer * self.layer_params() + self.embedding_params() + head + 2 * self.d_model

    def to_dict(self) -> dict:
        return asdict(self)


# Larger shapes (layers, width, heads, vocabulary) as published; the source of each is named.
PRESETS = {
    # Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1 (vocabulary: GPT-2 BPE).
    "gpt3-6.7b": dict(n_layer=32, d_model=4096, n_head=32, vocab=50257, learned_positions=2048),
    "gpt3-175b": dict(n_layer=96, d_model=12288, n_head=96, vocab=50257, learned_positions=2048),
    # NVIDIA NeMo-Megatron-Launcher conf/training/gpt3/{5b,20b}.yaml (GPT-2 BPE padded to a multiple of 128).
    "gpt3-5b": dict(n_layer=24, d_model=4096, n_head=32, vocab=50304, learned_positions=2048),
    "gpt3-20b": dict(n_layer=44, d_model=6144, n_head=48, vocab=50304, learned_positions=2048),
    # Smith et al. 2022, "Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B", Sec. 2.
    "mt-nlg-530b": dict(n_layer=105, d_model=20480, n_head=128, vocab=50257, learned_positions=2048),
    # BigScience, Le Scao et al. 2022, "BLOOM", Table 3 (ALiBi: no position table).
    "bloom-176b": dict(n_layer=70, d_model=14336, n_head=112, vocab=250880),
    # MosaicML llm-foundry MPT shapes (scripts/train/yamls/pretrain/mpt-*.yaml): ALiBi, vocab 50368.
    "mpt-1b": dict(n_layer=24, d_model=2048, n_head=16, vocab=50368),
    "mpt-3b": dict(n_layer=32, d_model=2560, n_head=20, vocab=50368),
    "mpt-7b": dict(n_layer=32, d_model=4096, n_head=32, vocab=50368),
    "mpt-13b": dict(n_layer=40, d_model=5120, n_head=40, vocab=50368),
    "mpt-30b": dict(n_layer=48, d_model=7168, n_head=64, vocab=50368),
    "mpt-70b": dict(n_layer=80, d_model=8192, n_head=64, vocab=50368),
    # Touvron et al. 2023, "Llama 2", Table 1 and the released configs (SwiGLU, untied head; GQA for 70B).
    "llama2-7b": dict(n_layer=32, d_model=4096, n_head=32, d_ff=11008, vocab=32000, gated_mlp=True,
                      tied_embeddings=False),
    "llama2-13b": dict(n_layer=40, d_model=5120, n_head=40, d_ff=13824, vocab=32000, gated_mlp=True,
                       tied_embeddings=False),
    "llama2-70b": dict(n_layer=80, d_model=8192, n_head=64, n_kv_head=8, d_ff=28672, vocab=32000, gated_mlp=True,
                       tied_embeddings=False),
    # Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3 (GQA, SwiGLU, untied head).
    "llama3-8b": dict(n_layer=32, d_model=4096, n_head=32, n_kv_head=8, d_ff=14336, vocab=128256,
                      gated_mlp=True, tied_embeddings=False),
    "llama3-70b": dict(n_layer=80, d_model=8192, n_head=64, n_kv_head=8, d_ff=28672, vocab=128256,
                       gated_mlp=True, tied_embeddings=False),
    "llama3-405b": dict(n_layer=126, d_model=16384, n_head=128, n_kv_head=8, d_ff=53248, vocab=128256,
                        gated_mlp=True, tied_embeddings=False),
}
SHAPE_FIELDS = ("n_layer", "d_model", "n_head", "vocab", "d_ff", "n_kv_head", "gated_mlp",
                "tied_embeddings", "learned_positions")


def available() -> list:
    return sorted(PRESETS)


def _from_dict(data: dict, name: str) -> Shape:
    unknown = sorted(set(data) - set(SHAPE_FIELDS) - {"name"})
    if unknown:
        raise ModelConfigError(f"model: unknown field {unknown[0]} (expected {', '.join(SHAPE_FIELDS)})")
    missing = [f for f in ("n_layer", "d_model", "n_head", "vocab") if f not in data]
    if missing:
        raise ModelConfigError(f"model: missing field {missing[0]}")
    return Shape(name=data.get("name", name), **{k: data[k] for k in SHAPE_FIELDS if k in data})


def load_shape(spec) -> Shape:
    """A cluster preset (``gpt3-175b``, ``mt-nlg-530b``, ``mpt-7b``, ...), a GPT-2 preset or
    shape accepted by ``load_model``, or a JSON object/file with this module's fields."""
    if isinstance(spec, Shape):
        return spec
    spec = str(spec).strip()
    if spec in PRESETS:
        return Shape(name=spec, **PRESETS[spec])
    data = None
    if spec.startswith("{"):
        try:
            data = json.loads(spec)
        except json.JSONDecodeError as e:
            raise ModelConfigError(f"model: not valid JSON ({e.msg} at column {e.colno})") from None
    elif spec.endswith(".json") and os.path.exists(spec):
        with open(spec) as f:
            data = json.load(f)
    if isinstance(data, dict) and "d_model" in data:
        return _from_dict(data, "custom")
    try:
        cfg = load_model(spec)
    except ModelConfigError as e:
        raise ModelConfigError(f"{e} (cluster shapes: {', '.join(available())})") from None
    assert set(GPT2_FIELDS) <= set(cfg.shape())
    if cfg.family == "llama":
        return Shape(name=cfg.name, n_layer=cfg.n_layer, d_model=cfg.n_embd, n_head=cfg.n_head,
                     vocab=cfg.vocab_size, d_ff=cfg.n_inner, n_kv_head=cfg.n_kv_head, gated_mlp=True,
                     tied_embeddings=cfg.tie_word_embeddings)
    return Shape(name=cfg.name, n_layer=cfg.n_layer, d_model=cfg.n_embd, n_head=cfg.n_head,
                 vocab=cfg.vocab_size, d_ff=0 if cfg.n_inner == 4 * cfg.n_embd else cfg.n_inner,
                 learned_positions=cfg.n_positions)
