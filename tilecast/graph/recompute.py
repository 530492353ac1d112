"""Activation recompute: which forward activations a training step keeps for its backward pass.

A tile is alive from its first write to its last read, so an activation the
backward pass reads is held through the rest of the forward pass. Recompute
trades work for memory: the forward tasks that produce an activation are
issued again in the backward pass, writing new tiles, so the forward's tiles
die as soon as the forward has used them.

- ``none``: every activation the backward pass reads is kept.
- ``selective``: as Korthikanti et al. 2022 ("Reducing Activation
  Recomputation in Large Transformer Models", section 5) define it, the
  attention core's activations, the quadratic-in-sequence scores and softmax
  probabilities, are recomputed and the rest kept. Here each layer's
  probabilities are recomputed from the kept queries and keys right before
  that layer's attention backward (``attn_qk``, ``softmax_stats``,
  ``softmax_apply``, as in the forward); the attention output is kept, so its
  product with the values is not redone.
- ``full``: only each layer's input is kept; the layer's forward is replayed
  from it right before the layer's backward (Chen et al. 2016, "Training Deep
  Nets with Sublinear Memory Cost"; Korthikanti et al.'s "full" recompute).
  The replay stops before the layer's last projection, whose output (the next
  layer's input) is kept anyway and which the backward pass does not read.

The replayed tasks run the same kernels on the same inputs in the same
accumulation order as the forward, so a step computes bit-identical losses
and gradients with any setting. Replayed tensors are named
``recompute:<name>`` and replayed tasks are tagged ``h<layer>.<part>.recompute``.
"""

from __future__ import annotations

from tilecast.errors import FieldError

RECOMPUTE = ("none", "selective", "full")
PREFIX = "recompute:"


def check_recompute(value) -> str:
    """``value`` if it is a recompute setting; ValueError naming the field otherwise."""
    if value not in RECOMPUTE:
        raise FieldError(f"recompute: must be one of {', '.join(RECOMPUTE)}, got {value!r}")
    return value
