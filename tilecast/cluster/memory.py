"""Memory per GPU: parameters, gradients, optimizer states, activations.

Model states follow Rajbhandari et al. 2020 ("ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", Sec. 5, Fig. 1) for mixed-precision Adam:
2 bytes of half-precision weights, 2 bytes of half-precision gradients and
K = 12 bytes of optimizer state (fp32 master weights, momentum, variance) per
parameter, partitioned over the N_d data-parallel ranks:

=========  =====================================

with gradients kept in the dtype they are reduced in (``Strategy.grad_reduce_bytes``):
2 bytes above; Megatron-LM keeps and reduces bf16 models' gradients in fp32
(``--grad-dtype fp32``: 4 bytes, 18 bytes per parameter with DDP).
stage      bytes per parameter of the rank's share
=========  =====================================
DDP        2 + 2 + 12
ZeRO-1     2 + 2 + 12 / N_d
ZeRO-2     2 + (2 + 12) / N_d
ZeRO-3     (2 + 2 + 12) / N_d
=========  =====================================

Activations per layer use the formulas of Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models", Sec. 4, Table 2), in
bytes, for sequence s, micro-batch b, width h, heads a, tensor parallelism t:

- no recomputation: s b h (10 + 24/t + 5 a s / (h t)); with sequence
  parallelism s b h (34/t + 5 a s / (h t));
- selective recomputation (attention core recomputed) or fused (flash)
  attention, which never stores the s x s scores: the same without the
  5 a s / (h t) term;
- full recomputation: 2 s b h per layer (the layer input; / t with sequence
  parallelism).

The 34 = 10 + 24 counts a 4h MLP; for other FFN widths the 16 s b h of MLP
activations (fc1 output, GELU output, dropout mask, in Korthikanti's count) is
scaled by f / 4h, and a gated MLP stores one more f-wide product.
Context parallelism divides the activations (and logits) by cp: each rank
holds seq / cp tokens. Expert parallelism divides the routed experts'
parameters by ep, and their states are sharded over the dp x cp / ep
expert-data-parallel ranks; ZeRO shards the other states over dp x cp ranks,
or over ``shard_group`` x cp with hybrid sharding. A mixture of experts' MLP
activations are those of the top-k routed (x the busiest rank's load) and
shared experts, plus the tokens permuted to and from the experts.
The first pipeline stage keeps the activations of min(m, p) micro-batches in
1F1B (m with GPipe); interleaving multiplies that by 1 + (p-1)/(p v)
(Korthikanti et al. 2022, Sec. 4.2.3).
"""

from __future__ import annotations

from dataclasses import dataclass

from tilecast.cluster import params as P
from tilecast.cluster.pipeline_split import stage_layers
from tilecast.cluster.strategy import DTYPE_BYTES


@dataclass(frozen=True)
class Memory:
    params: float
    grads: float
    optimizer: float
    activations: float
    other: float  # gathered ZeRO-3 layers, logits, reserved workspace

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.other

    def to_dict(self) -> dict:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "activations": self.activations, "other": self.other, "total": self.total}


def stage_params(shape, strat) -> float:
    """Parameters held by one tensor-parallel rank of the heaviest pipeline stage.

    The first stage holds the input embedding (and position table), the last one
    the final norm and the LM head: its own matrix, or with tied embeddings a copy
    of the embedding when pp > 1 (as Megatron-LM keeps one to update it). A
    mixture of experts' routed experts are divided over the ``ep`` ranks.
    """
    return sum(stage_param_split(shape, strat))


def stage_param_split(shape, strat) -> tuple:
    """(dense, routed-expert) parameters of one rank of the heaviest pipeline stage (:func:`stage_params`)."""
    layers = stage_layers(shape, strat)
    lp = P.rank_layer_params(shape, strat.ep)
    emb, head = P.embedding_params(shape), shape.vocab_size * shape.n_embd
    xp = P.routed_layer_params(shape) / strat.ep / strat.tp if shape.is_moe else 0
    if strat.pp == 1:
        p = layers[0] * lp + emb + 2 * shape.n_embd + (0 if shape.tie_word_embeddings else head)
        return p / strat.tp - layers[0] * xp, layers[0] * xp
    per = [n * lp for n in layers]
    per[0] += emb
    per[-1] += head + 2 * shape.n_embd
    i = max(range(len(per)), key=per.__getitem__)
    return per[i] / strat.tp - layers[i] * xp, layers[i] * xp


def model_state_bytes(n_params: float, zero: int, dp: int, weight_bytes: int = 2, grad_bytes: int = 2,
                      optimizer_bytes: int = 12) -> tuple:
    """(params, grads, optimizer) bytes for ``n_params`` parameters under ZeRO stage ``zero``."""
    w, g, o = weight_bytes * n_params, grad_bytes * n_params, optimizer_bytes * n_params
    if zero >= 1:
        o /= dp
    if zero >= 2:
        g /= dp
    if zero >= 3:
        w /= dp
    return w, g, o


def activation_bytes_per_layer(shape, strat) -> float:
    """Korthikanti et al.'s count on the rank's s / cp tokens (context parallelism splits them); a mixture of
    experts' MLP activations are those of the top-k routed (times the busiest rank's load) and shared experts,
    plus the tokens permuted to and from the experts (2 x 2 bytes per element each way)."""
    s, b, h, a, t = strat.seq // strat.cp, strat.micro_batch, shape.n_embd, shape.n_head, strat.tp
    gated = 1.5 if shape.gated_mlp else 1.0
    if shape.is_moe:
        m = P.moe_layer_share(shape)
        routed = shape.n_experts_per_token * strat.expert_load
        fe = shape.expert_intermediate_size
        width = (1 - m) * shape.intermediate_size + m * (routed + shape.n_shared_experts) * fe
        mlp_scale = width / (4.0 * h) * gated
        permuted = m * 4.0 * routed  # bytes per s b h: the dispatched and the combined copies, 2 bytes each
    else:
        mlp_scale = shape.intermediate_size / (4.0 * h) * gated
        permuted = 0.0
    sp = strat.sequence_parallel
    if strat.recompute == "full":
        return 2.0 * s * b * h / (t if sp else 1)
    replicated = 10.0  # layer-norm inputs, dropout masks, residual: sharded only with sequence parallelism
    # Q, K, V and the attention output (Q and the output n_head x head_dim wide: q / h of Korthikanti's sbh each),
    # MLP activations
    sharded = 4.0 + 4.0 * shape.q_dim / h + 16.0 * mlp_scale + permuted
    per = s * b * h * ((replicated / t if sp else replicated) + sharded / t)
    if strat.recompute == "none" and strat.attention == "unfused":
        per += 5.0 * a * s * strat.seq * b / t
    return per


def in_flight_micro_batches(strat) -> float:
    m, p, v = strat.micro_batches, strat.pp, strat.virtual_stages
    if strat.schedule == "gpipe":
        return float(m)
    base = float(min(m, p))
    if strat.schedule == "interleaved":
        base *= 1.0 + (p - 1) / (p * v)
    return base


def memory_per_gpu(shape, strat, cluster=None) -> Memory:
    n_dense, n_expert = stage_param_split(shape, strat)
    shard = strat.shard_ranks
    w, g, o = model_state_bytes(n_dense, strat.zero, shard,
                                grad_bytes=strat.grad_reduce_bytes)
    if n_expert:  # routed experts' states: sharded over the expert-data-parallel ranks
        xw, xg, xo = model_state_bytes(n_expert, strat.zero, max(1, shard // strat.ep),
                                       grad_bytes=strat.grad_reduce_bytes)
        w, g, o = w + xw, g + xg, o + xo
    layers = stage_layers(shape, strat)
    if strat.schedule == "1f1b" and strat.pp > 1:  # stage s holds min(m, p - s) micro-batches
        held = max(n * min(strat.micro_batches, strat.pp - s) for s, n in enumerate(layers))
    else:
        held = layers[0] * in_flight_micro_batches(strat)
    act = activation_bytes_per_layer(shape, strat) * held
    e = DTYPE_BYTES.get(strat.dtype, 2)
    other = 0.0
    if strat.zero >= 3:  # the gathered layer being computed plus the prefetched ones
        other += (1 + strat.fsdp_prefetch) * P.rank_layer_params(shape, strat.ep) / strat.tp * e
    # logits and their fp32 softmax on the last stage: b s V / t elements in dtype plus fp32
    other += strat.micro_batch * (strat.seq // strat.cp) * shape.vocab_size / strat.tp * (e + 4)
    if cluster is not None:
        other += cluster.gpu.reserved_bytes
    return Memory(params=w, grads=g, optimizer=o, activations=act, other=other)
