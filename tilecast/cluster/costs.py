"""Durations of the layer-level work of one rank: compute, tensor-parallel and
data-parallel collectives, pipeline sends, optimizer.

Compute: each matrix product takes flops / (peak x efficiency(flops of the
call)), the efficiency read from the cluster's per-dtype curve; the backward
pass runs two products (input gradient, weight gradient) of the forward's size
for each. Elementwise work (layer norms, dropout, residual adds, GELU, and the
softmax over the s x s scores when attention is not fused) is memory-bound:
bytes moved / (HBM bandwidth x efficiency), backward twice the forward.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilecast.cluster import flops as F
from tilecast.cluster import params as P
from tilecast.cluster.collectives import Group, p2p_time
from tilecast.cluster.collectives import collective_time as _collective_time
from tilecast.cluster.fp8_costs import dense_fp8_cast_times
from tilecast.cluster.memory import stage_param_split
from tilecast.cluster.moe_costs import moe_gemm_times, moe_layer_extra
from tilecast.cluster.strategy import DTYPE_BYTES

# Adam step with fp32 master weights, per parameter: read master, m, v, grad (4 each),
# write master, m, v (4 each) and the half-precision copy (2), zero the grad (2).
OPTIMIZER_BYTES_PER_PARAM = 32.0


@dataclass(frozen=True)
class LayerCosts:
    """Seconds for one layer and one micro-batch on one rank, plus per-step costs."""

    fwd_compute: float
    bwd_compute: float
    recompute: float  # extra compute in backward (recomputed forward work)
    fwd_tp: float  # blocking tensor-parallel collectives in the forward
    bwd_tp: float  # ... in the backward (including recomputed forward collectives)
    head_fwd: float  # LM head + loss on the last stage, per micro-batch
    head_bwd: float
    p2p: float  # one activation (or gradient) send between stages
    layer_param_gather: float  # ZeRO-3: all-gather one layer's parameters
    layer_grad_scatter: float  # ZeRO-3: reduce-scatter one layer's gradients
    grad_reduce: float  # DDP / ZeRO-1: one stage's gradient reduction, all buckets together
    grad_scatter: float  # ZeRO-2: one stage's gradient reduce-scatter (per micro-batch)
    param_gather: float  # ZeRO-1/2: all-gather of updated parameters after the optimizer
    optimizer: float
    grad_bytes: float  # bytes of one stage's gradients on the wire
    flops_fwd_layer: float  # hardware flops of one layer forward (one rank, one micro-batch)
    fwd_ep: float = 0.0  # blocking expert all-to-alls (dispatch, combine) of one layer's forward
    bwd_ep: float = 0.0  # ... of its backward (and recomputed forward)
    fwd_cp: float = 0.0  # ring-attention communication not hidden by attention, forward
    bwd_cp: float = 0.0  # ... backward (and recomputed attention)
    replica_reduce: float = 0.0  # hybrid sharding: all-reduce of the sharded gradients across replicas


def layer_costs(shape, strat, cluster) -> LayerCosts:
    gpu = cluster.gpu
    t, b, s, cp = strat.tp, strat.micro_batch, strat.seq, strat.cp
    algo = strat.collective_algo

    def collective_time(op, n, group, c):
        return _collective_time(op, n, group, c, algo)

    # Activations, collectives and attention stay in 16 bits when the GEMMs run in fp8
    # (Transformer Engine keeps attention and communication in bf16).
    e = max(2, DTYPE_BYTES[strat.dtype])
    tokens = b * s // cp  # a rank's share of the micro-batch's tokens (context parallelism splits sequences)
    h, f = shape.n_embd, shape.intermediate_size
    dt = strat.dtype
    attn_dt = "bf16" if dt == "fp8" else dt

    if shape.is_moe:
        calls = F.moe_gemm_shapes(shape, tokens, t, strat.ep, strat.expert_load)
        gemm_t = float(sum(moe_gemm_times(calls, gpu, dt).values()))
        gemm_flops = sum(2.0 * m * n * kk * w for m, n, kk, w, _ in calls.values())
    else:
        shapes = F.layer_gemm_shapes(shape, tokens, t)
        gemms = {k: 2.0 * m * n * kk for k, (m, n, kk) in shapes.items()}
        gemm_t = float(sum(gpu.matmul_time(gemms[k], dt, min(dims)) for k, dims in shapes.items()))
        gemm_flops = sum(gemms.values())
    attn_flops = F.layer_attention_flops(shape, tokens, s, t)  # the rank's queries against the whole sequence
    if strat.attention != "unfused":
        # a causal fused kernel computes the lower triangle only; its backward recomputes the scores
        attn_hw = attn_flops * F.causal_fraction(s)
        attn_t = float(gpu.matmul_time(attn_hw, attn_dt)) / gpu.attention_fraction(strat.attention)
        attn_t *= F.fused_attention_head_padding(shape.head_dim)  # e.g. head dim 112 runs the 128 kernel
        attn_bwd = F.FUSED_ATTENTION_BACKWARD * attn_t
        attn_mem = 0.0
    else:
        attn_hw = attn_flops  # the whole square, masked afterwards
        calls_n = 2 * b * shape.n_head / t  # one (s x d) x (d x s) and one (s x s) x (s x d) product per head
        attn_t = float(gpu.matmul_time(attn_flops / calls_n, attn_dt)) * calls_n
        attn_bwd = 2.0 * attn_t
        # scores written and read by softmax, probabilities written, dropout mask and output: ~(4e + 2) bytes/element
        attn_mem = float(gpu.memory_time(b * shape.n_head / t * s * s / cp * (4 * e + 2)))
    repl = 12.0 * tokens * h * e  # two layer norms, two dropout + residual adds
    if strat.sequence_parallel:
        repl /= t
    gate = 3 if shape.gated_mlp else 2
    if shape.is_moe:  # GELU / SwiGLU over the MLPs each token goes through (the permutations: moe_costs)
        m, fe = P.moe_layer_share(shape), shape.expert_intermediate_size
        routed = tokens * shape.n_experts_per_token * strat.expert_load
        act_bytes = ((1 - m) * gate * tokens * f + m * gate * (routed + tokens * shape.n_shared_experts) * fe) * e / t
    else:
        act_bytes = gate * tokens * f * e / t  # GELU / SwiGLU
    elem_t = float(gpu.memory_time(repl + act_bytes))

    moe_fwd, moe_bwd, moe_comm = moe_layer_extra(shape, strat, cluster, tokens, e)  # router, permutations, casts
    cast_fwd, cast_bwd = dense_fp8_cast_times(shape, strat, gpu, tokens)  # fp8 operand casts (zero in bf16)
    fwd = gemm_t + attn_t + attn_mem + elem_t + moe_fwd + cast_fwd
    bwd = 2.0 * (gemm_t + attn_mem + elem_t) + attn_bwd + moe_bwd + cast_bwd
    if strat.recompute == "full":
        rec = fwd
    elif strat.recompute == "selective":
        rec = attn_t + attn_mem
    else:
        rec = 0.0

    tp_group = Group.placed(cluster, t, stride=1)
    act = tokens * h * e
    if strat.sequence_parallel:
        one = collective_time("all_gather", act, tp_group, cluster) + collective_time("reduce_scatter", act, tp_group, cluster)
    else:
        one = collective_time("all_reduce", act, tp_group, cluster)
    fwd_tp = 2 * one  # after attention and after the MLP (Shoeybi et al. 2019, Fig. 3)
    bwd_tp = 2 * one + (fwd_tp if strat.recompute == "full" else 0.0)
    fwd_ep, bwd_ep = expert_all_to_all(shape, strat, cluster, tokens, e)
    fwd_ep += moe_comm  # the dispatch's token-count exchange, again when full recomputation replays the forward
    bwd_ep += moe_comm if strat.recompute == "full" else 0.0
    fwd_cp, bwd_cp = ring_attention_exposed(shape, strat, cluster, tokens, e, attn_t, attn_bwd)

    head = float(gpu.matmul_time(F.lm_head_flops(shape, tokens, t), dt, min(tokens, h, shape.vocab_size / t)))
    head_mem = float(gpu.memory_time(tokens * shape.vocab_size / t * (e + 4) * 2))  # logits, fp32 softmax

    crosses = t * cp * strat.dp >= cluster.gpus_per_node
    p2p = p2p_time(act / t, cluster, crosses)  # Megatron scatter/gather: each TP rank sends 1/t

    st = _state_costs(shape, strat, cluster, collective_time, e)
    return LayerCosts(
        fwd_compute=fwd, bwd_compute=bwd, recompute=rec, fwd_tp=fwd_tp, bwd_tp=bwd_tp,
        head_fwd=head + head_mem, head_bwd=2 * head + head_mem,
        p2p=p2p, **st,
        flops_fwd_layer=gemm_flops + attn_hw,
        fwd_ep=fwd_ep, bwd_ep=bwd_ep, fwd_cp=fwd_cp, bwd_cp=bwd_cp,
    )


def expert_all_to_all(shape, strat, cluster, tokens: int, e: int) -> tuple:
    """(forward, backward) seconds of one layer's blocking expert all-to-alls (the mean over layers).

    Each MoE layer dispatches the tokens to their experts' ranks and combines the results back: two
    all-to-alls of :func:`tilecast.cluster.flops.all_to_all_bytes` over the ``ep`` ranks in the forward,
    two in the backward (their gradients), two more when full recomputation replays the forward.
    """
    if not shape.is_moe or strat.ep == 1:
        return 0.0, 0.0
    group = Group.placed(cluster, strat.ep, stride=strat.tp * strat.cp)
    n = F.all_to_all_bytes(shape, tokens, strat.tp, e, strat.capacity_factor)
    one = _collective_time("all_to_all", n, group, cluster, strat.collective_algo)
    fwd = 2 * one * P.moe_layer_share(shape)
    return fwd, fwd + (fwd if strat.recompute == "full" else 0.0)


def ring_attention_exposed(shape, strat, cluster, tokens: int, e: int, attn_t: float, attn_bwd: float) -> tuple:
    """(forward, backward) seconds of ring-attention communication that attention compute does not hide.

    Context parallelism (Liu et al. 2023, "Ring Attention with Blockwise Transformers"; Megatron-Core's
    context parallelism) splits each sequence over ``cp`` ranks; each layer passes the key/value blocks
    around the ring in ``cp - 1`` steps, each step's transfer (the rank's tokens x 2 x key/value width,
    its 1/tp share) overlapped with the attention of the block already there (1/cp of the rank's
    attention). The backward passes the keys/values and their gradients (twice the bytes); recomputing
    attention (selective or full) runs the forward ring again.
    """
    cp = strat.cp
    if cp == 1:
        return 0.0, 0.0
    group = Group.placed(cluster, cp, stride=strat.tp)
    kv = tokens * 2.0 * shape.kv_dim * e / strat.tp
    step = p2p_time(kv, cluster, group.nodes > 1)
    step2 = p2p_time(2 * kv, cluster, group.nodes > 1)
    fwd = (cp - 1) * max(0.0, step - attn_t / cp)
    bwd = (cp - 1) * max(0.0, step2 - attn_bwd / cp) + (fwd if strat.recompute != "none" else 0.0)
    return fwd, bwd


def _state_costs(shape, strat, cluster, collective_time, e) -> dict:
    """Gradient reduction, ZeRO gathers and scatters, optimizer: per step or per layer.

    Dense parameters are replicated over the dp x cp ranks, routed experts over dp x cp / ep (the
    expert-data-parallel ranks); each part is reduced (DDP) or sharded (ZeRO) over its own ranks. With
    hybrid sharding (``shard_group`` N < dp) the dense states are sharded over N x cp ranks and the
    sharded gradients all-reduced across the dp / N replicas once per step (``replica_reduce``).
    """
    t, cp, ep = strat.tp, strat.cp, strat.ep
    n_dense, n_expert = stage_param_split(shape, strat)
    n_stage = n_dense + n_expert
    grb = strat.grad_reduce_bytes
    shard = strat.shard_ranks if strat.zero else strat.dp * cp
    shard_grp = Group.placed(cluster, shard, stride=t)
    x_grp = Group.placed(cluster, max(1, shard // ep), stride=t * ep)

    def reduce(op, n_d, n_x):
        out = collective_time(op, n_d, shard_grp, cluster)
        if n_x:
            out += collective_time(op, n_x, x_grp, cluster)
        return out

    gbytes = n_stage * grb
    lp = P.rank_layer_params(shape, ep) / t
    replicas = strat.dp // strat.shard_group if (strat.shard_group and strat.zero) else 1
    replica = 0.0
    if replicas > 1:
        rep_grp = Group.placed(cluster, replicas, stride=t * shard)
        replica = collective_time("all_reduce", gbytes / shard, rep_grp, cluster)
    local = n_dense / (shard if strat.zero >= 1 else 1) + n_expert / (max(1, shard // ep) if strat.zero >= 1 else 1)
    return dict(
        layer_param_gather=collective_time("all_gather", lp * e, shard_grp, cluster),
        layer_grad_scatter=collective_time("reduce_scatter", lp * grb, shard_grp, cluster),
        grad_reduce=reduce("all_reduce" if strat.zero == 0 else "reduce_scatter", n_dense * grb, n_expert * grb),
        grad_scatter=reduce("reduce_scatter", n_dense * grb, n_expert * grb),
        param_gather=reduce("all_gather", n_dense * e, n_expert * e) if strat.zero in (1, 2) else 0.0,
        optimizer=float(cluster.gpu.memory_time(local * OPTIMIZER_BYTES_PER_PARAM)),
        grad_bytes=gbytes,
        replica_reduce=replica,
    )
