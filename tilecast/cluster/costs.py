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

from tilecast.cluster import params as P

from dataclasses import dataclass

from tilecast.cluster import flops as F
from tilecast.cluster.collectives import Group, p2p_time
from tilecast.cluster.collectives import collective_time as _collective_time
from tilecast.cluster.memory import stage_params
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


def layer_costs(shape, strat, cluster) -> LayerCosts:
    gpu = cluster.gpu
    t, b, s = strat.tp, strat.micro_batch, strat.seq
    algo = strat.collective_algo

    def collective_time(op, n, group, c):
        return _collective_time(op, n, group, c, algo)

    # Activations, collectives and attention stay in 16 bits when the GEMMs run in fp8
    # (Transformer Engine keeps attention and communication in bf16).
    e = max(2, DTYPE_BYTES[strat.dtype])
    tokens = b * s
    h, f = shape.n_embd, shape.intermediate_size
    dt = strat.dtype
    attn_dt = "bf16" if dt == "fp8" else dt

    shapes = F.layer_gemm_shapes(shape, tokens, t)
    gemms = {k: 2.0 * m * n * kk for k, (m, n, kk) in shapes.items()}
    gemm_t = float(sum(gpu.matmul_time(gemms[k], dt, min(dims)) for k, dims in shapes.items()))
    attn_flops = F.layer_attention_flops(shape, tokens, s, t)
    if strat.attention != "unfused":
        # a causal fused kernel computes the lower triangle only; its backward recomputes the scores
        attn_hw = attn_flops * F.causal_fraction(s)
        attn_t = float(gpu.matmul_time(attn_hw, attn_dt)) / gpu.attention_fraction(strat.attention)
        attn_bwd = F.FUSED_ATTENTION_BACKWARD * attn_t
        attn_mem = 0.0
    else:
        attn_hw = attn_flops  # the whole square, masked afterwards
        calls = 2 * b * shape.n_head / t  # one (s x d) x (d x s) and one (s x s) x (s x d) product per head
        attn_t = float(gpu.matmul_time(attn_flops / calls, attn_dt)) * calls
        attn_bwd = 2.0 * attn_t
        # scores written and read by softmax, probabilities written, dropout mask and output: ~(4e + 2) bytes/element
        attn_mem = float(gpu.memory_time(b * shape.n_head / t * s * s * (4 * e + 2)))
    repl = 12.0 * tokens * h * e  # two layer norms, two dropout + residual adds
    if strat.sequence_parallel:
        repl /= t
    act_bytes = (3 if shape.gated_mlp else 2) * tokens * f * e / t  # GELU / SwiGLU
    elem_t = float(gpu.memory_time(repl + act_bytes))

    fwd = gemm_t + attn_t + attn_mem + elem_t
    bwd = 2.0 * (gemm_t + attn_mem + elem_t) + attn_bwd
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

    head = float(gpu.matmul_time(F.lm_head_flops(shape, tokens, t), dt, min(tokens, h, shape.vocab_size / t)))
    head_mem = float(gpu.memory_time(tokens * shape.vocab_size / t * (e + 4) * 2))  # logits, fp32 softmax

    crosses = t * strat.dp >= cluster.gpus_per_node
    p2p = p2p_time(act / t, cluster, crosses)  # Megatron scatter/gather: each TP rank sends 1/t

    dp_group = Group.placed(cluster, strat.dp, stride=t)
    n_stage = stage_params(shape, strat)
    gbytes = n_stage * strat.grad_reduce_bytes
    lbytes = P.layer_params(shape) / t * e
    lgbytes = P.layer_params(shape) / t * strat.grad_reduce_bytes
    if strat.zero == 0:
        grad_reduce = collective_time("all_reduce", gbytes, dp_group, cluster)
    else:
        grad_reduce = collective_time("reduce_scatter", gbytes, dp_group, cluster)
    local = n_stage / (strat.dp if strat.zero >= 1 else 1)
    return LayerCosts(
        fwd_compute=fwd, bwd_compute=bwd, recompute=rec, fwd_tp=fwd_tp, bwd_tp=bwd_tp,
        head_fwd=head + head_mem, head_bwd=2 * head + head_mem,
        p2p=p2p,
        layer_param_gather=collective_time("all_gather", lbytes, dp_group, cluster),
        layer_grad_scatter=collective_time("reduce_scatter", lgbytes, dp_group, cluster),
        grad_reduce=grad_reduce,
        grad_scatter=collective_time("reduce_scatter", gbytes, dp_group, cluster),
        param_gather=collective_time("all_gather", n_stage * e, dp_group, cluster) if strat.zero in (1, 2) else 0.0,
        optimizer=float(gpu.memory_time(local * OPTIMIZER_BYTES_PER_PARAM)),
        grad_bytes=gbytes,
        flops_fwd_layer=sum(gemms.values()) + attn_hw,
    )
