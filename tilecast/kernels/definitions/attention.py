"""Batched attention products on tiles.

Layouts (row major): Q, K, V, O and their gradients are (batch, seq, head, head_dim)
tiles, the layout a token-major projection writes; scores and probabilities are
(batch, head, seq_q, seq_k) tiles. Every product loops over (batch, head) pairs.

q0 and k0 are the absolute sequence positions of a tile's first query and key
rows; with ``causal``, the entries whose key comes after the query are masked:
``attn_qk`` writes -inf there, and the products with probabilities (or their
gradients, zero there too) take those entries as zero whatever the tile holds,
so that the C kernels skip them.
"""

from tilecast.kernels.definitions.blend import blend
from tilecast.kernels.registry import kernel


def _bmm_flops(p):
    return 2.0 * p["bt"] * p["ht"] * p["sq"] * p["sk"] * p["d"]


def _tok(x, p, s):
    return x.reshape((int(p.bt), int(s), int(p.ht), int(p.d)))


def _scores(x, p):
    return x.reshape((int(p.bt), int(p.ht), int(p.sq), int(p.sk)))


def _masked(xp, p):
    """(sq x sk) booleans: entries whose key comes after the query (k0 + j > q0 + i)."""
    qi = xp.arange(int(p.sq))[:, None] + int(p.q0)
    kj = xp.arange(int(p.sk))[None, :] + int(p.k0)
    return kj > qi


def _probs(xp, pr, p):
    """The probability tile as (bt, ht, sq, sk), its masked entries zero when causal."""
    sv = _scores(pr, p)
    return xp.where(_masked(xp, p), sv.dtype.type(0), sv) if p.causal else sv


@kernel("attn_qk", "q:R k:R s:W", "bt ht sq sk d alpha q0 k0 causal", _bmm_flops)
def attn_qk(xp, bufs, p):
    """S = alpha * Q K^T per (batch, head); with causal, entries with key > query are -inf.

    q0 and k0 are the absolute sequence positions of the tiles' first rows.
    """
    q, k, s = bufs
    qv = _tok(q, p, p.sq).transpose(0, 2, 1, 3)
    kv = _tok(k, p, p.sk).transpose(0, 2, 3, 1)
    sv = _scores(s, p)
    xp.matmul(qv, kv, out=sv)
    if p.alpha != 1.0:
        sv *= s.dtype.type(p.alpha)
    if p.causal:
        sv[..., _masked(xp, p)] = -xp.inf


@kernel("attn_pv", "p:R v:R o:RW", "bt ht sq sk d alpha beta q0 k0 causal", _bmm_flops)
def attn_pv(xp, bufs, p):
    """O = alpha * P V + beta * O per (batch, head); O is a (batch, seq_q, head, d) tile; causal: masked P is 0."""
    pr, v, o = bufs
    prod = xp.matmul(_probs(xp, pr, p), _tok(v, p, p.sk).transpose(0, 2, 1, 3))
    blend(_tok(o, p, p.sq).transpose(0, 2, 1, 3), prod, p.alpha, p.beta)


@kernel("attn_ptv", "p:R x:R y:RW", "bt ht sq sk d alpha beta q0 k0 causal", _bmm_flops)
def attn_ptv(xp, bufs, p):
    """Y = alpha * P^T X + beta * Y per (batch, head); X is (batch, seq_q, ...), Y (batch, seq_k, ...); causal:
    masked P is 0."""
    pr, x, y = bufs
    prod = xp.matmul(_probs(xp, pr, p).transpose(0, 1, 3, 2), _tok(x, p, p.sq).transpose(0, 2, 1, 3))
    blend(_tok(y, p, p.sk).transpose(0, 2, 1, 3), prod, p.alpha, p.beta)


@kernel("attn_rowdot", "do:R o:R d:W", "bt sq ht dh", lambda p: 2.0 * p["bt"] * p["sq"] * p["ht"] * p["dh"])
def attn_rowdot(xp, bufs, p):
    """D[b, h, q] = sum_d dO[b, q, h, d] * O[b, q, h, d] (= row sums of P * dP)."""
    do, o, d = bufs
    shape = (int(p.bt), int(p.sq), int(p.ht), int(p.dh))
    prod = (do.reshape(shape) * o.reshape(shape)).sum(axis=3)
    d.reshape((int(p.bt), int(p.ht), int(p.sq)))[...] = prod.transpose(0, 2, 1)
