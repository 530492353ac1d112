"""What a mixture-of-experts layer runs besides its matrix products and its dispatch/combine all-to-alls.

Per MoE layer and micro-batch on one rank (``tokens`` = the rank's tokens, ``routed`` = tokens x top-k x
the busiest rank's load), each part in seconds, forward and backward:

- ``router``: the softmax and top-k over the router's logits, in fp32 (the router runs in full precision:
  Fedus et al. 2021, "Switch Transformers", Sec. 2.4, "selective precision"; Megatron-Core's
  ``--moe-router-dtype fp32``): logits written and read, probabilities written and read (4 passes of 4
  bytes per token and expert), the top-k probabilities and indices written (4 + 8 bytes per choice);
  the backward moves as much. Its matrix product is costed with the others
  (:func:`tilecast.cluster.flops.moe_gemm_shapes`).
- ``permute``: the gather of each token's top-k copies into expert order and the weighted scatter back
  (Megatron-Core ``moe_utils.permute`` / ``unpermute``): routed rows written and read once each way,
  4 x routed x hidden x 2 bytes; the backward is the same permutation of the gradients (as many bytes,
  not the elementwise ops' twice).
- ``sort_chunks``: with expert parallelism and more than one local expert, the rows received from the
  ``ep`` ranks arrive rank by rank and are regrouped by local expert before the expert GEMMs, and back
  before the combine (Megatron-Core ``token_dispatcher.py``, ``MoEAlltoAllTokenDispatcher``,
  "Permutation 2: Sort tokens by local expert", ``sort_chunks_by_idxs``): another read and write of the
  routed rows each way, forward and backward.
- ``fp8_casts`` (fp8 only): the expert GEMMs' activations are cast to fp8 before each product (the fc1
  and fc2 inputs in the forward, the gradients of their outputs in the backward). Per element: the amax
  read of current scaling (2 bytes), the read of the bf16 value (2), the fp8 row-wise copy (1) and the
  fp8 column-wise (transposed) copy the backward's weight-gradient GEMM needs on Hopper (1): 6 bytes
  (Transformer Engine's ``Float8CurrentScaling`` recipe, the one Megatron-Bridge's H100 fp8 recipes for
  Qwen3-30B-A3B use, ``qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs_config``; delayed scaling would skip the
  amax read, 4 bytes; Hopper's fp8 tensor cores take the TN layout only, hence the transposed copy). The dense GEMMs' casts (attention
  projections, dense layers' MLPs) are costed in :mod:`tilecast.cluster.fp8_costs`.
- ``token_counts``: before the dispatch, the ranks of the expert-parallel group exchange how many tokens
  each sends to each expert (an all-to-all of experts x 8 bytes) and the host reads the counts back to
  size the variable all-to-all (``tokens_per_expert`` moved to the CPU, a device-to-host
  synchronisation, in the same dispatcher): forward only, latency-bound; the host's wait and the
  relaunch after it are not modelled.

Every part is zero for a dense model; each is multiplied by the share of layers that are MoE layers.
"""

from __future__ import annotations

from tilecast.cluster import params as P
from tilecast.cluster.collectives import Group, collective_time

ROUTER_FP32_PASSES = 4  # logits write + read, probabilities write + read
TOPK_BYTES = 4 + 8  # one fp32 probability and one int64 index per choice
FP8_CAST_BYTES = 2 + 2 + 1 + 1  # amax read, value read, fp8 row-wise and column-wise writes (per element)
COUNT_BYTES = 8  # one int64 token count per expert


def moe_gemm_times(calls: dict, gpu, dtype: str) -> dict:
    """name -> forward seconds of the products of :func:`tilecast.cluster.flops.moe_gemm_shapes`.

    A grouped GEMM runs m / m_call per-expert products of m_call rows: each one's flops and smallest
    dimension set its efficiency (the dense products, the router's included, are one call, m_call = m),
    so fewer rows per expert (more experts, fewer of them chosen, larger EP) cost more per flop.
    """
    return {name: float(w * (m / mc) * gpu.matmul_time(2.0 * mc * n * k, dtype, min(mc, n, k)))
            for name, (m, n, k, w, mc) in calls.items()}


def moe_layer_parts(shape, strat, cluster, tokens: int, e: int) -> dict:
    """part name -> (forward, backward) seconds of one layer on one rank (the mean over layers), as above.

    ``tokens``: the rank's tokens of one micro-batch (before tensor parallelism); ``e``: activation
    bytes per element (2). An empty dict for a dense model.
    """
    if not shape.is_moe:
        return {}
    gpu, t, ep = cluster.gpu, strat.tp, strat.ep
    share = P.moe_layer_share(shape)
    h, k, n_exp = shape.n_embd, shape.n_experts_per_token, shape.n_experts
    routed = tokens * k * strat.expert_load
    router_tokens = tokens / t if strat.sequence_parallel else tokens

    def mem(nbytes):
        return float(gpu.memory_time(nbytes)) * share

    router = mem(router_tokens * (n_exp * 4 * ROUTER_FP32_PASSES + k * TOPK_BYTES))
    permute = mem(4.0 * routed * h * e / t)
    parts = {"router": (router, router), "permute": (permute, permute)}
    if ep > 1 and n_exp // ep > 1:
        s = mem(4.0 * routed * h * e / t)
        parts["sort_chunks"] = (s, s)
    if strat.dtype == "fp8":
        fe = shape.expert_intermediate_size
        mats = 2 if shape.gated_mlp else 1
        fwd_elems = routed * (h + fe / t)  # fc1 input (hidden), fc2 input (the expert's inner width / tp)
        bwd_elems = routed * (h + mats * fe / t)  # gradients of fc2's output (hidden) and fc1's (gated: 2 fe)
        parts["fp8_casts"] = (mem(fwd_elems * FP8_CAST_BYTES), mem(bwd_elems * FP8_CAST_BYTES))
    if ep > 1:
        group = Group.placed(cluster, ep, stride=t * strat.cp)
        c = collective_time("all_to_all", n_exp * COUNT_BYTES, group, cluster, strat.collective_algo) * share
        parts["token_counts"] = (c, 0.0)
    return parts


def moe_layer_extra(shape, strat, cluster, tokens: int, e: int) -> tuple:
    """(forward compute, backward compute, forward blocking communication) seconds of one layer from
    :func:`moe_layer_parts`: the memory-bound parts run on the compute stream, the token-count exchange
    blocks it as the dispatch does."""
    parts = moe_layer_parts(shape, strat, cluster, tokens, e)
    comm = parts.pop("token_counts", (0.0, 0.0))
    fwd = sum(f for f, _ in parts.values())
    bwd = sum(b for _, b in parts.values())
    return fwd, bwd, comm[0]
