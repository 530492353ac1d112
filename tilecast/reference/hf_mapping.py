"""Name and layout mapping between tilecast's GPT-2 parameters and transformers' GPT2LMHeadModel.

Works on numpy arrays keyed by name, so it needs neither torch nor transformers.
transformers stores the fused QKV projection as ``attn.c_attn.weight`` (E x 3E,
Conv1D layout: in x out); tilecast keeps three (E, heads, head_dim) tensors.
"""

from __future__ import annotations

import numpy as np

from tilecast.graph.model_config import ModelConfig


def hf_names(cfg: ModelConfig) -> list[str]:
    """transformers' parameter names (tied LM head excluded), in tilecast's order."""
    names = ["transformer.wte.weight", "transformer.wpe.weight"]
    for l in range(cfg.n_layer):
        p = f"transformer.h.{l}."
        names += [p + s for s in (
            "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
            "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
            "mlp.c_proj.weight", "mlp.c_proj.bias")]
    return names + ["transformer.ln_f.weight", "transformer.ln_f.bias"]


def from_hf(cfg: ModelConfig, hf: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers' arrays -> tilecast's parameter arrays (contiguous, dtype kept)."""
    E, H, D = cfg.n_embd, cfg.n_head, cfg.head_dim
    out = {"wte": hf["transformer.wte.weight"], "wpe": hf["transformer.wpe.weight"]}
    for l in range(cfg.n_layer):
        s, t = f"transformer.h.{l}.", f"h.{l}."
        w, b = hf[s + "attn.c_attn.weight"], hf[s + "attn.c_attn.bias"]
        for j, c in enumerate("qkv"):
            out[t + f"attn.w{c}"] = w[:, j * E:(j + 1) * E].reshape(E, H, D)
            out[t + f"attn.b{c}"] = b[j * E:(j + 1) * E].reshape(H, D)
        out[t + "attn.wo"] = hf[s + "attn.c_proj.weight"].reshape(H, D, E)
        out[t + "attn.bo"] = hf[s + "attn.c_proj.bias"]
        for a, b_ in (("ln_1", "ln_1"), ("ln_2", "ln_2")):
            out[t + f"{a}.g"] = hf[s + f"{b_}.weight"]
            out[t + f"{a}.b"] = hf[s + f"{b_}.bias"]
        out[t + "mlp.wfc"] = hf[s + "mlp.c_fc.weight"]
        out[t + "mlp.bfc"] = hf[s + "mlp.c_fc.bias"]
        out[t + "mlp.wproj"] = hf[s + "mlp.c_proj.weight"]
        out[t + "mlp.bproj"] = hf[s + "mlp.c_proj.bias"]
    out["ln_f.g"] = hf["transformer.ln_f.weight"]
    out["ln_f.b"] = hf["transformer.ln_f.bias"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def to_hf(cfg: ModelConfig, tc: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """tilecast's parameter arrays (or gradients, keyed by parameter name) -> transformers' names."""
    E = cfg.n_embd
    out = {"transformer.wte.weight": tc["wte"], "transformer.wpe.weight": tc["wpe"]}
    for l in range(cfg.n_layer):
        s, t = f"transformer.h.{l}.", f"h.{l}."
        out[s + "attn.c_attn.weight"] = np.concatenate([tc[t + f"attn.w{c}"].reshape(E, E) for c in "qkv"], axis=1)
        out[s + "attn.c_attn.bias"] = np.concatenate([tc[t + f"attn.b{c}"].reshape(E) for c in "qkv"])
        out[s + "attn.c_proj.weight"] = tc[t + "attn.wo"].reshape(E, E)
        out[s + "attn.c_proj.bias"] = tc[t + "attn.bo"]
        for a in ("ln_1", "ln_2"):
            out[s + f"{a}.weight"] = tc[t + f"{a}.g"]
            out[s + f"{a}.bias"] = tc[t + f"{a}.b"]
        out[s + "mlp.c_fc.weight"] = tc[t + "mlp.wfc"]
        out[s + "mlp.c_fc.bias"] = tc[t + "mlp.bfc"]
        out[s + "mlp.c_proj.weight"] = tc[t + "mlp.wproj"]
        out[s + "mlp.c_proj.bias"] = tc[t + "mlp.bproj"]
    out["transformer.ln_f.weight"] = tc["ln_f.g"]
    out["transformer.ln_f.bias"] = tc["ln_f.b"]
    return out
