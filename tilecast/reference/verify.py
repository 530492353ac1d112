"""Numerical check of tilecast's training step against transformers' GPT2LMHeadModel or LlamaForCausalLM.

Both run two AdamW steps from the same weights on the same batches; errors are
max |a - b| / max |b| per tensor (b = transformers).

Loss and gradients are compared in float32, the precision tilecast trains in.
Parameters after the AdamW updates are compared in float64 by default: AdamW
divides each gradient element by sqrt(v) + eps, so an element that float32
rounding leaves near eps (sums that cancel; the attention key bias, whose
gradient is zero in exact arithmetic) moves its parameter by a sizeable
fraction of the learning rate in a direction set by rounding alone. Two
correct float32 implementations then disagree far beyond 1e-4: transformers'
own eager and SDPA attention do, after two steps on gpt2-tiny. In float64 the
same comparison is well conditioned and still catches any real error.

transformers' Llama computes RMSNorm, the RoPE angles and the eager attention's
softmax in float32 whatever the model's type (right for half-precision
training). In the float64 run that float32 rounding would come back through
AdamW as above (3e-4 on llama-tiny), so there the reference computes the same
formulas in float64 (:func:`_llama_in_float64`; the RoPE frequencies, scaled or
not, from tilecast's ``rope_inv_freq`` in float64); the float32 run is
transformers' own eager LlamaForCausalLM, its RoPE scaling included.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tilecast.errors import FieldError
from tilecast.reference import hf_mapping, hf_mapping_llama
from tilecast.reference.step import TrainState, reference_step
from tilecast.graph import Tiling
from tilecast.graph.gpt2 import AdamWConfig
from tilecast.graph.llama import rope_frequencies
from tilecast.graph.model_config import ModelConfig
from tilecast.graph.models import build_forward, build_step
from tilecast.kernels.definitions.llama import rope_inv_freq

TOLERANCES = {"loss": 1e-5, "logits": 1e-4, "grads": 1e-4, "params": 1e-4}


class ReferenceUnavailable(RuntimeError):
    """torch / transformers are not installed."""


@dataclass
class PairRun:
    """Errors of one tilecast-vs-transformers run at one precision."""

    dtype: str
    loss: float
    logits: float
    grads: dict[str, float]
    params: dict[str, float]
    losses: dict[str, list[float]]


@dataclass
class VerifyResult:
    loss: float
    grads: dict[str, float]
    params: dict[str, float]
    dtypes: dict[str, str]
    losses: dict[str, list[float]] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    logits: float = 0.0  # the first step's logits, in the loss's precision

    @property
    def failures(self) -> list[str]:
        out = []
        if not self.loss <= TOLERANCES["loss"]:
            out.append("loss")
        if not self.logits <= TOLERANCES["logits"]:
            out.append("logits")
        out += [f"grad {n}" for n, e in self.grads.items() if not e <= TOLERANCES["grads"]]
        out += [f"param {n}" for n, e in self.params.items() if not e <= TOLERANCES["params"]]
        return out

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict:
        return {"ok": self.ok, "loss": self.loss, "logits": self.logits, "grads": self.grads, "params": self.params,
                "dtypes": self.dtypes, "tolerances": TOLERANCES, "losses": self.losses, **self.extra}


def rel_err(a, b) -> float:
    """max |a - b| / max |b| (the absolute difference when b is all zero)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    if not b.size:
        return 0.0
    diff = float(np.max(np.abs(a - b)))
    scale = float(np.max(np.abs(b)))
    return diff / scale if scale > 0 else diff


def _import_reference():
    try:
        import torch
        import transformers
    except ImportError as e:
        raise ReferenceUnavailable(
            f"verify needs torch and transformers ({e.name} is missing): pip install 'tilecast[reference]'") from None
    return torch, transformers


def _mapping(cfg: ModelConfig):
    return hf_mapping_llama if cfg.family == "llama" else hf_mapping


def hf_model(cfg: ModelConfig, seed: int, dtype=np.float32):
    """A GPT2LMHeadModel (or LlamaForCausalLM) of the same shape, dropout off, eager attention."""
    torch, transformers = _import_reference()
    torch.manual_seed(seed)
    if cfg.family == "llama":
        err = cfg.numeric_error()
        if err:
            raise FieldError(err)
        conf = transformers.LlamaConfig(
            vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, intermediate_size=cfg.n_inner,
            num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_kv_head,
            max_position_embeddings=cfg.n_positions, rms_norm_eps=cfg.layer_norm_epsilon,
            rope_parameters=hf_rope_parameters(cfg),
            tie_word_embeddings=cfg.tie_word_embeddings, attention_bias=False, mlp_bias=False,
            attention_dropout=0.0, hidden_act="silu", bos_token_id=None, eos_token_id=None, pad_token_id=None,
            attn_implementation="eager")
        model = transformers.LlamaForCausalLM(conf)
        model.config._attn_implementation = "eager"
        if np.dtype(dtype) == np.float64:
            _llama_in_float64(model.double(), cfg)
        else:
            model.float()
        return model.train()
    conf = transformers.GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.n_positions, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
        n_head=cfg.n_head, n_inner=cfg.n_inner, activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        layer_norm_epsilon=cfg.layer_norm_epsilon, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=None)
    model = transformers.GPT2LMHeadModel(conf)
    model.config._attn_implementation = "eager"
    model = model.double() if np.dtype(dtype) == np.float64 else model.float()
    return model.train()


def hf_rope_parameters(cfg: ModelConfig) -> dict:
    """transformers' ``rope_parameters`` of ``cfg``: theta, and the rope_type with its keys when scaled."""
    out = {"rope_type": cfg.rope_scaling or "default", "rope_theta": cfg.rope_theta}
    keys = dict(rope_factor="factor", rope_low_freq_factor="low_freq_factor",
                rope_high_freq_factor="high_freq_factor", rope_original_positions="original_max_position_embeddings")
    out.update({k: getattr(cfg, f) for f, k in keys.items() if getattr(cfg, f) is not None})
    return out


def forward_logits(cfg: ModelConfig, batch: int, seq: int, tiling: Tiling, params: dict, ids, targets,
                   dtype=np.float32) -> np.ndarray:
    """The logits of tilecast's tiled forward graph (numpy reference), kept for comparison."""
    from tilecast.reference.run import run_reference
    from tilecast.reference.tiles import TileStore

    graph = build_forward(cfg, batch, seq, tiling, dtype=dtype)
    store = TileStore(graph)
    for name, p in params.items():
        store.set_tensor(name, p)
    store.set_tensor("ids", np.asarray(ids, dtype=np.int64))
    store.set_tensor("targets", np.asarray(targets, dtype=np.int64))
    run_reference(graph, store, free_activations=False)
    return store.tensor("logits")


_EAGER64 = "tilecast_eager_float64"


def _llama_in_float64(model, cfg: ModelConfig) -> None:
    """RMSNorm, the RoPE angles and the attention softmax of a float64 LlamaForCausalLM in float64.

    Same formulas as transformers' eager modules: x / sqrt(mean(x^2) + eps) * weight;
    cos, sin of position * theta^(-2i/d) (rescaled as ``cfg`` says) with the halves repeated; softmax(q k^T * scale
    + mask) v with each key/value head serving its group of query heads.
    """
    import types

    torch, transformers = _import_reference()

    def attention(module, q, k, v, mask, scaling, dropout=0.0, **kw):
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        w = torch.matmul(q, k.transpose(2, 3)) * scaling
        if mask is None or mask.dtype == torch.bool:  # the mask's form follows the attention's name
            n, m = w.shape[-2:]
            keep = torch.ones(n, m, dtype=torch.bool).tril(m - n) if mask is None else mask
            w = w.masked_fill(~keep, float("-inf"))
        else:
            w = w + mask
        w = torch.softmax(w, dim=-1)
        return torch.matmul(w, v).transpose(1, 2).contiguous(), w

    transformers.AttentionInterface.register(_EAGER64, attention)
    model.config._attn_implementation = _EAGER64

    def rms_forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    freqs = rope_frequencies(cfg)

    def rope_forward(self, x, position_ids):
        inv = torch.from_numpy(rope_inv_freq(self.inv_freq.shape[0] * 2, dtype=np.float64, **freqs))
        ang = position_ids[..., None].to(torch.float64) * inv
        ang = torch.cat((ang, ang), dim=-1)
        return ang.cos().to(x.dtype), ang.sin().to(x.dtype)

    for mod in model.modules():
        kind = type(mod).__name__
        if kind == "LlamaRMSNorm":
            mod.forward = types.MethodType(rms_forward, mod)
        elif kind == "LlamaRotaryEmbedding":
            mod.forward = types.MethodType(rope_forward, mod)


def run_pair(cfg: ModelConfig, batch: int, seq: int, tiling: Tiling, dtype=np.float32, steps: int = 2,
             lr: float = 1e-3, seed: int = 0, recompute: str = "none") -> PairRun:
    """``steps`` training steps in tilecast (numpy reference) and transformers at one precision."""
    torch, _ = _import_reference()
    model = hf_model(cfg, seed, dtype)
    named = dict(model.named_parameters())
    init = {n: p.detach().numpy().copy() for n, p in named.items()}
    data = np.random.default_rng(seed).integers(0, cfg.vocab_size, size=(steps, batch, seq + 1))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    hf_losses, hf_grads = [], {}
    for t in range(steps):
        logits = model(torch.from_numpy(data[t, :, :-1])).logits
        if t == 0:
            hf_logits = logits.detach().numpy().copy()
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, cfg.vocab_size), torch.from_numpy(data[t, :, 1:]).reshape(-1))
        opt.zero_grad()
        loss.backward()
        hf_losses.append(float(loss.detach()))
        if t == 0:
            hf_grads = {n: p.grad.detach().numpy().copy() for n, p in named.items()}
        opt.step()
    hf_final = {n: p.detach().numpy() for n, p in named.items()}

    graph = build_step(cfg, batch, seq, tiling, AdamWConfig(lr=lr), dtype=dtype, recompute=recompute)
    from_hf, to_hf = _mapping(cfg).from_hf, _mapping(cfg).to_hf
    state = TrainState(from_hf(cfg, init))
    tc_logits = forward_logits(cfg, batch, seq, tiling, state.params, data[0, :, :-1], data[0, :, 1:], dtype)
    tc_losses, tc_grads = [], {}
    for t in range(steps):
        res = reference_step(graph, state, data[t, :, :-1], data[t, :, 1:], want_grads=(t == 0))
        tc_losses.append(res.loss)
        if t == 0:
            tc_grads = to_hf(cfg, res.grads)
    tc_final = to_hf(cfg, state.params)
    return PairRun(
        dtype=np.dtype(dtype).name,
        loss=abs(tc_losses[0] - hf_losses[0]) / abs(hf_losses[0]),
        logits=rel_err(tc_logits, hf_logits),
        grads={n: rel_err(tc_grads[n], hf_grads[n]) for n in hf_grads},
        params={n: rel_err(tc_final[n], hf_final[n]) for n in hf_final},
        losses={"tilecast": tc_losses, "transformers": hf_losses},
    )


def verify(cfg: ModelConfig, batch: int, seq: int, tiling: Tiling, params_dtype: str = "float64",
           steps: int = 2, lr: float = 1e-3, seed: int = 0, recompute: str = "none") -> VerifyResult:
    """Loss and gradients from a float32 run; parameters from a ``params_dtype`` run; both with the step's
    ``recompute`` setting (:mod:`tilecast.graph.recompute`)."""
    r32 = run_pair(cfg, batch, seq, tiling, np.float32, steps, lr, seed, recompute)
    rp = r32 if np.dtype(params_dtype) == np.float32 else run_pair(cfg, batch, seq, tiling, params_dtype, steps,
                                                                      lr, seed, recompute)
    extra = {}
    if rp is not r32:
        extra["float32_params"] = r32.params
    return VerifyResult(
        loss=r32.loss, logits=r32.logits, grads=r32.grads, params=rp.params,
        dtypes={"loss": r32.dtype, "grads": r32.dtype, "params": rp.dtype},
        losses=r32.losses, extra=extra)
