"""Flops of the transformer's matrix products, and the model-flops (MFU) formula.

Per token and layer, the forward matrix products of a decoder block with model
width h, FFN width f, key/value width k and sequence length s cost
2h(h+2k) (QKV) + 2h^2 (output projection) + 2hf x (2, or 3 for a gated MLP)
+ 4sh (attention scores and attention-weighted values; the full s x s square,
as the MFU convention counts it). The backward pass costs twice the forward.
"""

from __future__ import annotations


def model_flops_per_token(shape, seq: int) -> float:
    """Training flops per token for MFU: 6N + 12 L h s.

    6N for the parameter matmuls (forward 2N, backward 4N: Kaplan et al. 2020,
    "Scaling Laws for Neural Language Models", Sec. 2.1) plus 12 L h s for
    attention (Chowdhery et al. 2022, "PaLM", Appendix B: 6N + 12LHQT with
    H heads of width Q, HQ = h). N counts all parameters, embeddings included,
    as MosaicML's and Megatron-LM's MFU reporting do. Recomputation is not
    counted: MFU measures useful work only.
    """
    return 6.0 * shape.n_params() + 12.0 * shape.n_layer * shape.d_model * seq


def layer_gemm_flops(shape, tokens: int, seq: int, tp: int) -> dict:
    """Forward flops of one layer's matrix products on one tensor-parallel rank, per call.

    ``tokens`` = micro-batch x sequence length.
    """
    h, f, k = shape.d_model, shape.ff, shape.kv_dim
    return {
        "qkv": 2.0 * tokens * h * (h + 2 * k) / tp,
        "proj": 2.0 * tokens * h * h / tp,
        "fc1": 2.0 * tokens * h * f * (2 if shape.gated_mlp else 1) / tp,
        "fc2": 2.0 * tokens * f * h / tp,
    }


def layer_attention_flops(shape, tokens: int, seq: int, tp: int) -> float:
    """Forward flops of the attention scores and weighted sum on one tensor-parallel rank."""
    return 4.0 * tokens * seq * shape.d_model / tp


def lm_head_flops(shape, tokens: int, tp: int) -> float:
    return 2.0 * tokens * shape.d_model * shape.vocab / tp
