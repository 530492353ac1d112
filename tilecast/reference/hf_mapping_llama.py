"""Name and layout mapping between tilecast's Llama parameters and transformers' LlamaForCausalLM.

Works on numpy arrays keyed by name, so it needs neither torch nor transformers.
transformers' linear layers store weights (out, in); tilecast stores them (in, out),
with the query/key/value outputs split as (heads, head_dim) and the output
projection's input as (heads, head_dim). A tied LM head is the token embedding
and has no name of its own on either side.
"""

from __future__ import annotations

import numpy as np

from tilecast.graph.model_config import ModelConfig

_LINEAR = {"attn.wq": "self_attn.q_proj", "attn.wk": "self_attn.k_proj", "attn.wv": "self_attn.v_proj",
           "attn.wo": "self_attn.o_proj", "mlp.wgate": "mlp.gate_proj", "mlp.wup": "mlp.up_proj",
           "mlp.wdown": "mlp.down_proj"}
_NORMS = {"attn_norm.g": "input_layernorm", "mlp_norm.g": "post_attention_layernorm"}


def _shapes(cfg: ModelConfig) -> dict:
    E, H, KV, D = cfg.n_embd, cfg.n_head, cfg.n_kv_head, cfg.head_dim
    return {"attn.wq": (E, H, D), "attn.wk": (E, KV, D), "attn.wv": (E, KV, D), "attn.wo": (H, D, E),
            "mlp.wgate": None, "mlp.wup": None, "mlp.wdown": None}


def from_hf(cfg: ModelConfig, hf: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers' arrays -> tilecast's parameter arrays (contiguous, dtype kept)."""
    shapes = _shapes(cfg)
    out = {"wte": hf["model.embed_tokens.weight"]}
    for l in range(cfg.n_layer):
        s, t = f"model.layers.{l}.", f"h.{l}."
        for ours, theirs in _NORMS.items():
            out[t + ours] = hf[s + theirs + ".weight"]
        for ours, theirs in _LINEAR.items():
            w = hf[s + theirs + ".weight"].T
            out[t + ours] = w.reshape(shapes[ours]) if shapes[ours] else w
    out["norm.g"] = hf["model.norm.weight"]
    if not cfg.tie_word_embeddings:
        out["lm_head"] = hf["lm_head.weight"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def to_hf(cfg: ModelConfig, tc: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """tilecast's parameter arrays (or gradients, keyed by parameter name) -> transformers' names."""
    out = {"model.embed_tokens.weight": tc["wte"]}
    for l in range(cfg.n_layer):
        s, t = f"model.layers.{l}.", f"h.{l}."
        for ours, theirs in _NORMS.items():
            out[s + theirs + ".weight"] = tc[t + ours]
        for ours, theirs in _LINEAR.items():
            w = tc[t + ours]
            out[s + theirs + ".weight"] = (w.reshape(-1, cfg.n_embd) if ours == "attn.wo"
                                           else w.reshape(w.shape[0], -1)).T
    out["model.norm.weight"] = tc["norm.g"]
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = tc["lm_head"]
    return out
