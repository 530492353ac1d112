"""Memory per GPU when serving a model: weights, KV cache, workspace; the largest batch that fits.

The KV cache holds, for every token of every sequence in flight and every
layer of the rank's pipeline stage, one key and one value vector per key/value
head the rank owns: ``2 x kv_heads_per_rank x head_dim x kv_bytes`` bytes per
token and layer. With grouped-query attention (GQA, Ainslie et al. 2023) a
model has fewer key/value heads than query heads; tensor parallelism splits
them over the ranks, and when ``tp`` exceeds their number each rank keeps a
copy of the one head its query heads use (as vLLM and TensorRT-LLM do), so a
rank holds ``ceil(kv_heads / tp)`` of them.

Weights: the heaviest pipeline stage holds ``ceil(n_layer / pp)`` layers plus
the token embedding (first stage) or the LM head (last stage), split over the
``tp`` ranks; embedding and head stay in 16 bits when the layers are fp8 (as
TensorRT-LLM's and vLLM's fp8 checkpoints keep them).

Workspace: the activations of the largest forward pass in flight (a prefill
of ``prefill_tokens``: the input, the QKV output, the attention output and two
MLP-wide buffers, 16-bit) and the fp32 logits of one token per sequence,
plus the cluster's ``reserved_bytes`` (CUDA context, allocator slack).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tilecast.cluster import params as P

INFERENCE_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True)
class InferenceMemory:
    """Bytes on one GPU of the heaviest pipeline stage."""

    weights: float
    kv_cache: float
    workspace: float
    reserved: float

    @property
    def total(self) -> float:
        return self.weights + self.kv_cache + self.workspace + self.reserved

    def to_dict(self) -> dict:
        return {"weights": self.weights, "kv_cache": self.kv_cache, "workspace": self.workspace,
                "reserved": self.reserved, "total": self.total}


def kv_heads_per_rank(shape, tp: int) -> int:
    """Key/value heads one tensor-parallel rank stores (replicated when tp > kv heads)."""
    return math.ceil(shape.n_kv_head / tp)


def stage_layers(shape, pp: int) -> int:
    """Layers of the heaviest pipeline stage (stages differ by at most one layer)."""
    return math.ceil(shape.n_layer / pp)


def kv_bytes_per_token(shape, tp: int, pp: int, kv_dtype: str, cp: int = 1) -> float:
    """KV-cache bytes one token of one sequence takes on one GPU of the heaviest stage (the cache split over
    ``cp`` GPUs with context parallelism)."""
    out = 2.0 * kv_heads_per_rank(shape, tp) * shape.head_dim * INFERENCE_DTYPE_BYTES[kv_dtype] * stage_layers(shape, pp)
    return out / cp if cp > 1 else out


def weight_bytes(shape, tp: int, pp: int, weight_dtype: str) -> float:
    """Weight bytes on one GPU of the heaviest stage."""
    wb = INFERENCE_DTYPE_BYTES[weight_dtype]
    eb = max(2, wb)  # embedding and LM head stay 16-bit
    layers = stage_layers(shape, pp) * P.layer_params(shape) * wb
    emb = P.embedding_params(shape) * eb
    head = (0 if shape.tie_word_embeddings else shape.vocab_size * shape.n_embd) * eb
    if pp == 1:
        ends = emb + head
    else:  # first stage: embedding; last stage: head (a tied head is a copy of the embedding)
        ends = max(emb, head if head else shape.vocab_size * shape.n_embd * eb)
    return (layers + ends + 2 * shape.n_embd * eb) / tp


def workspace_bytes(shape, tp: int, prefill_tokens: int, sequences: int) -> float:
    """Transient activations of the largest forward pass plus fp32 logits of one token per sequence."""
    h = shape.n_embd
    per_token = 2 * h + (shape.q_dim + 2 * shape.kv_dim) / tp + (3 if shape.gated_mlp else 2) * shape.intermediate_size / tp
    return prefill_tokens * per_token * 2.0 + sequences * shape.vocab_size / tp * 4.0


def inference_memory(shape, cluster, *, tp: int, pp: int, batch: int, context: int, prefill_tokens: int,
                     weight_dtype: str, kv_dtype: str, cp: int = 1) -> InferenceMemory:
    """Memory of one GPU serving ``batch`` sequences of up to ``context`` tokens each (weights replicated over
    the ``cp`` GPUs a prompt is split over; its KV cache and prefill activations divided)."""
    return InferenceMemory(
        weights=weight_bytes(shape, tp, pp, weight_dtype),
        kv_cache=batch * context * kv_bytes_per_token(shape, tp, pp, kv_dtype, cp),
        workspace=workspace_bytes(shape, tp, prefill_tokens // cp, batch),
        reserved=cluster.gpu.reserved_bytes,
    )


def largest_batch(shape, cluster, *, tp: int, pp: int, input_len: int, output_len: int, weight_dtype: str,
                  kv_dtype: str, prefill_tokens_per_sequence: int | None = None, cp: int = 1) -> int:
    """The most sequences of ``input_len + output_len`` tokens whose KV cache fits beside the weights.

    Memory grows linearly with the batch (KV cache, logits and, when the whole
    batch is prefilled at once, the prefill workspace), so the bound is
    closed-form. ``prefill_tokens_per_sequence``: prefill workspace per sequence
    (default ``input_len``, the whole batch prefilled in one pass). 0 when not
    even the weights fit.
    """
    ptok = input_len if prefill_tokens_per_sequence is None else prefill_tokens_per_sequence
    fixed = weight_bytes(shape, tp, pp, weight_dtype) + cluster.gpu.reserved_bytes
    per_seq = ((input_len + output_len) * kv_bytes_per_token(shape, tp, pp, kv_dtype, cp)
               + workspace_bytes(shape, tp, ptok // cp, 1))
    free = cluster.gpu.memory_bytes - fixed
    return max(0, int(free // per_seq))
