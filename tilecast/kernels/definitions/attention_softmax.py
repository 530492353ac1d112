"""Scores and softmax in one task, for score tiles that hold whole rows.

When a query tile sees a single key tile (the first query tile of a causal
attention, or an untiled sequence), its softmax needs no statistics from other
tiles: the scores of each (batch, head) pair are turned into probabilities while
they are still in cache, instead of being written out, read back for the
statistics, then read and written again. Same results as ``attn_qk``,
``softmax_stats`` (beta 0) and ``softmax_apply`` in turn.
"""

from types import SimpleNamespace

from tilecast.kernels.definitions.attention import _bmm_flops, attn_qk
from tilecast.kernels.definitions.softmax import softmax_apply, softmax_stats
from tilecast.kernels.registry import kernel


def _flops(p):
    return _bmm_flops(p) + 7.0 * p["bt"] * p["ht"] * p["sq"] * p["sk"]  # softmax_stats 4, softmax_apply 3


@kernel("attn_qk_softmax", "q:R k:R s:W stats:W", "bt ht sq sk d alpha q0 k0 causal", _flops)
def attn_qk_softmax(xp, bufs, p):
    """S = softmax(alpha Q K^T + causal mask) per (batch, head) row; stats = (row max, sum of exponentials)."""
    q, k, s, stats = bufs
    attn_qk(xp, [q, k, s], p)
    sm = SimpleNamespace(rows=int(p.bt * p.ht * p.sq), cols=int(p.sk), beta=0.0)
    softmax_stats(xp, [s, stats], sm)
    softmax_apply(xp, [stats, s], sm)
