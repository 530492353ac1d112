"""How many transformer layers each pipeline stage runs.

- ``even``: n_layer / pp each (the layer count must divide);
- ``head``: LM-head aware: the last stage also runs the LM head, worth
  2 h V / (forward flops of one layer per token) layers, so stages are balanced
  on layers + that share (the smallest largest stage), and when layers are left
  over the first stages give them up first (the first stage also holds the
  input embedding). Llama 3 405B's 126 layers on 16 stages come out as the
  paper's split, 7 on the first and the last stage and 8 elsewhere (Dubey et al.
  2024, "The Llama 3 Herd of Models", Sec. 3.3.2);
- an explicit tuple of per-stage counts (``Strategy.stage_layers``).

Uneven splits run with one model chunk per stage (no interleaving).
"""

from __future__ import annotations

import math

from tilecast.cluster import params as P

SPLITS = ("even", "head")


def head_layer_equivalents(shape, seq: int) -> float:
    """The LM head's forward flops per token in units of one layer's (GEMMs and attention)."""
    layer = 2.0 * P.active_layer_params(shape) + 4.0 * shape.q_dim * seq
    return 2.0 * shape.n_embd * shape.vocab_size / layer


def balanced_split(n_layer: int, pp: int, head: float) -> tuple:
    """Per-stage layer counts minimising the largest stage's layers + (head on the last stage)."""
    extra = [0.0] * (pp - 1) + [head]
    for target in sorted({k + e for k in range(1, n_layer + 1) for e in set(extra)}):
        caps = [max(0, math.floor(target - e + 1e-9)) for e in extra]
        if min(caps) >= 1 and sum(caps) >= n_layer:
            break
    surplus, s = sum(caps) - n_layer, 0
    while surplus:  # the first stages give up the layers left over, one each in turn
        if caps[s % pp] > 1:
            caps[s % pp] -= 1
            surplus -= 1
        s += 1
    return tuple(caps)


def stage_layers(shape, strat) -> tuple:
    """Layers of each pipeline stage (each model chunk when interleaved) for ``strat`` on ``shape``."""
    chunks = strat.pp * strat.virtual_stages
    if strat.stage_layers:
        return tuple(strat.stage_layers)
    if strat.pipeline_split == "head" and strat.pp > 1:
        return balanced_split(shape.n_layer, strat.pp, head_layer_equivalents(shape, strat.seq))
    return (shape.n_layer // chunks,) * strat.pp
