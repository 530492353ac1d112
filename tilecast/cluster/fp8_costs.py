"""The casts an fp8 layer runs around its dense matrix products (Transformer Engine's fp8 recipes).

Before each fp8 product, Transformer Engine casts the bf16 operand that changes every micro-batch (the
product's input in the forward, the gradient of its output in the backward) to fp8 with current
scaling: the amax read (2 bytes per element), the read of the value (2), the fp8 row-wise copy (1) and
the fp8 column-wise (transposed) copy that Hopper's TN-only fp8 tensor cores need for the other
backward product (1): 6 bytes per element, :data:`tilecast.cluster.moe_costs.FP8_CAST_BYTES`.
Memory-bound, at the HBM bandwidth x the cluster's elementwise efficiency.

Per layer and micro-batch on one tensor-parallel rank (m = the rank's tokens, the layer's widths as
:func:`tilecast.cluster.flops.layer_gemm_shapes` gives them):

- forward: the inputs of QKV (m x h), of the attention output projection (m x q / tp), of the MLP's
  first product (m x h) and of its second (m x f / tp);
- backward: the gradients of those four products' outputs (m x (q + 2 kv) / tp, m x h,
  m x f x (2 if gated) / tp, m x h).

A mixture of experts' routed MLPs are costed in :mod:`tilecast.cluster.moe_costs` (``fp8_casts``); here
only its attention and, on its dense layers, its MLP. With these costs outside the GEMM curve, fp8 and
bf16 products share one fitted plateau, as a fraction of each dtype's datasheet peak
(``tilecast.cluster.calibrate``).
"""

from __future__ import annotations

from tilecast.cluster import params as P
from tilecast.cluster.moe_costs import FP8_CAST_BYTES


def dense_fp8_cast_elements(shape, tokens: int, tp: int) -> tuple:
    """(forward, backward) elements cast to fp8 per layer (mean over layers) and micro-batch, one rank."""
    h, f, q, kv = shape.n_embd, shape.intermediate_size, shape.q_dim, shape.kv_dim
    mats = 2 if shape.gated_mlp else 1
    dense_mlp = 1.0 - (P.moe_layer_share(shape) if shape.is_moe else 0.0)
    fwd = tokens * (h + q / tp) + dense_mlp * tokens * (h + f / tp)
    bwd = tokens * ((q + 2 * kv) / tp + h) + dense_mlp * tokens * (mats * f / tp + h)
    return fwd, bwd


def dense_fp8_cast_times(shape, strat, gpu, tokens: int) -> tuple:
    """(forward, backward) seconds of those casts; (0, 0) unless the products run in fp8."""
    if strat.dtype != "fp8":
        return 0.0, 0.0
    fwd, bwd = dense_fp8_cast_elements(shape, tokens, strat.tp)
    return float(gpu.memory_time(fwd * FP8_CAST_BYTES)), float(gpu.memory_time(bwd * FP8_CAST_BYTES))
