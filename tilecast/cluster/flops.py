"""Flops of the transformer's matrix products, model flops (MFU) and hardware flops (HFU).

Per token and layer, the forward matrix products of a decoder block with model
width h, query width q (heads x head_dim; h for most models, twice h for
Qwen3-30B-A3B), FFN width f, key/value width k and sequence length s cost
2h(q+2k) (QKV) + 2qh (output projection) + 2hf x (2, or 3 for a gated MLP)
+ 4sq (attention scores and attention-weighted values over the whole s x s
square, as the MFU convention counts them). The backward pass costs twice the
forward.

What a GPU actually runs differs in two places, which the cost model
(``costs.py``) uses and MFU does not:

- a causal fused-attention kernel (FlashAttention, cuDNN) skips the score blocks
  above the diagonal: s(s+1)/2 of the s^2 scores, :func:`causal_fraction`;
  an unfused implementation computes the whole square and masks it;
- a fused kernel's backward recomputes the scores: 2.5x its forward flops
  instead of 2x (Dao 2023, "FlashAttention-2", Sec. 4.1: backward flops are
  2.5 times the forward's), :data:`FUSED_ATTENTION_BACKWARD`.
"""

from __future__ import annotations

from tilecast.cluster import params as P

FUSED_ATTENTION_BACKWARD = 2.5


def model_params(shape) -> float:
    """Parameters that take part in matrix products: the blocks, the final norm and the LM head.

    An input-embedding lookup is no matrix product: an untied input embedding and a
    learned position table are left out; a tied embedding counts once, as the head.
    A mixture of experts counts its active parameters: the experts one token goes
    through (top-k routed and shared), as MFU is quoted for MoE models (e.g.
    DeepSeek-V3's technical report, Dai et al. 2024).
    """
    return shape.n_layer * P.active_layer_params(shape) + 2 * shape.n_embd + shape.vocab_size * shape.n_embd


def model_flops_per_token(shape, seq: int) -> float:
    """Training flops per token for MFU: 6N + 12 L h s.

    6N for the parameter matmuls (forward 2N, backward 4N: Kaplan et al. 2020,
    "Scaling Laws for Neural Language Models", Sec. 2.1) plus 12 L h s for
    attention (Chowdhery et al. 2022, "PaLM", Appendix B: 6N + 12LHQT with
    H heads of width Q; HQ = h for most models, ``q_dim`` when head_dim differs; the whole s x s square, as MosaicML's and NeMo's
    published MFU count it). N is :func:`model_params`: lookups of untied input
    embeddings and position tables are no flops. Recomputation is not counted:
    MFU measures useful work only (see :func:`hardware_flops_per_token`).
    """
    return 6.0 * model_params(shape) + 12.0 * shape.n_layer * shape.q_dim * seq


def hardware_flops_per_token(shape, seq: int, recompute: str) -> float:
    """Flops per token for HFU: the model flops plus the recomputed forward work.

    Full recomputation runs every layer's forward again (+2N_layers + 4 L q s),
    selective recomputation the attention core (+4 L q s), q = n_head x head_dim. Same convention as
    MFU otherwise, as MosaicML's llm-foundry benchmark README defines HFU
    (``scripts/train/benchmarking/README.md``, "HFU": 4 x instead of 3 x the
    forward flops with activation checkpointing).
    """
    base = model_flops_per_token(shape, seq)
    attn_fwd = 4.0 * shape.n_layer * shape.q_dim * seq
    if recompute == "full":
        return base + 2.0 * shape.n_layer * P.active_layer_params(shape) + attn_fwd
    if recompute == "selective":
        return base + attn_fwd
    return base


def layer_gemm_shapes(shape, tokens: int, tp: int) -> dict:
    """(m, n, k) of one layer's forward matrix products on one tensor-parallel rank.

    ``tokens`` = micro-batch x sequence length = m. The backward's two products
    (input gradient, weight gradient) per forward product use the same three
    dimensions in another order. A gated MLP's two input projections count as one
    product of twice the width (as fused implementations run them).
    """
    h, f, k, q = shape.n_embd, shape.intermediate_size, shape.kv_dim, shape.q_dim
    return {
        "qkv": (tokens, (q + 2 * k) / tp, h),
        "proj": (tokens, h, q / tp),
        "fc1": (tokens, f * (2 if shape.gated_mlp else 1) / tp, h),
        "fc2": (tokens, h, f / tp),
    }


def moe_gemm_shapes(shape, tokens: int, tp: int, ep: int, load: float) -> dict:
    """Mixture-of-experts layers' forward matrix products on one rank: name -> (m, n, k, share, m_call).

    ``share``: the fraction of layers that run it (dense MLPs in the first ``n_dense_layers`` layers, the
    router and the experts in the others), ``m_call``: the rows of one call, which set its efficiency.
    The routed experts of an expert-parallel rank process ``tokens x top-k x load`` rows in all (the
    mean, tokens x top-k, times the busiest rank's ``load``), ``tokens x top-k x load x ep / experts``
    per expert (a grouped GEMM); experts are split over tensor parallelism as the dense MLP is.
    """
    h, fe, m = shape.n_embd, shape.expert_intermediate_size, P.moe_layer_share(shape)
    mats = 2 if shape.gated_mlp else 1
    q = shape.q_dim
    out = {"qkv": (tokens, (q + 2 * shape.kv_dim) / tp, h, 1.0, tokens), "proj": (tokens, h, q / tp, 1.0, tokens)}
    if m < 1:
        f = shape.intermediate_size
        out["fc1"] = (tokens, f * mats / tp, h, 1.0 - m, tokens)
        out["fc2"] = (tokens, h, f / tp, 1.0 - m, tokens)
    out["router"] = (tokens, shape.n_experts, h, m, tokens)
    routed = tokens * shape.n_experts_per_token * load
    per_expert = routed * ep / shape.n_experts
    out["expert_fc1"] = (routed, fe * mats / tp, h, m, per_expert)
    out["expert_fc2"] = (routed, h, fe / tp, m, per_expert)
    if shape.n_shared_experts:
        fs = fe * shape.n_shared_experts
        out["shared_fc1"] = (tokens, fs * mats / tp, h, m, tokens)
        out["shared_fc2"] = (tokens, h, fs / tp, m, tokens)
    return out


def all_to_all_bytes(shape, tokens: int, tp: int, dtype_bytes: int, capacity_factor: float = 0.0) -> float:
    """Bytes one rank sends in one expert dispatch (or combine): tokens x top-k x hidden x dtype bytes, each
    tensor-parallel rank dispatching 1/tp of the tokens; buffers padded to capacity carry ``capacity_factor``
    times that (0: dropless, the tokens themselves)."""
    return tokens * shape.n_experts_per_token * shape.n_embd * dtype_bytes / tp * (capacity_factor or 1.0)


def layer_gemm_flops(shape, tokens: int, seq: int, tp: int) -> dict:
    """Forward flops of one layer's matrix products on one tensor-parallel rank, per call."""
    return {name: 2.0 * m * n * k for name, (m, n, k) in layer_gemm_shapes(shape, tokens, tp).items()}


def layer_attention_flops(shape, tokens: int, seq: int, tp: int) -> float:
    """Forward flops of the attention scores and weighted sum on one tensor-parallel rank,
    the whole s x s square (the MFU convention; see :func:`causal_fraction`), over n_head x head_dim."""
    return 4.0 * tokens * seq * shape.q_dim / tp


def causal_fraction(seq: int) -> float:
    """Share of the s x s scores a causal kernel computes: s(s+1)/2 of s^2."""
    return (seq + 1) / (2.0 * seq)


def fused_attention_head_padding(head_dim: int) -> float:
    """Work a fused attention kernel does per unit of the model's head dimension.

    FlashAttention-2 runs a head dimension rounded up to a multiple of 32 (256
    above 192: ``head_size_rounded`` in its ``flash_api.cpp``), and MosaicML's
    Triton kernel rounds up to a power of two, which agrees up to 128: the released
    MPT-30B's 112 would run the 128 kernel, 128/112 = 1.14x the work (the
    benchmarked MPT-30B of the validation table has heads of 128); 64, 128, 160,
    256 run as they are.
    """
    d = int(head_dim)
    padded = -(-d // 32) * 32 if d <= 192 else 256 * -(-d // 256)
    return padded / d


def lm_head_flops(shape, tokens: int, tp: int) -> float:
    return 2.0 * tokens * shape.n_embd * shape.vocab_size / tp
