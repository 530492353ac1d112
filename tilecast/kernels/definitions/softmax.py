"""Row-wise softmax over a last axis split across tiles (online max / sum-exp merge).

stats[row] = (running max m, running sum of exp(s - m)), merged tile by tile as in
Milakov & Gimelshein, "Online normalizer calculation for softmax" (2018).
"""

from tilecast.kernels.registry import kernel


def _rc(p, c):
    return c * p["rows"] * p["cols"]


@kernel("softmax_stats", "s:R stats:RW", "rows cols beta", lambda p: _rc(p, 4.0))
def softmax_stats(xp, bufs, p):
    """Merge a tile's row max and sum of exponentials into stats (rows x 2)."""
    s, stats = bufs
    sv = s.reshape((int(p.rows), int(p.cols)))
    st = stats.reshape((int(p.rows), 2))
    m_tile = sv.max(axis=1)
    if p.beta == 0.0:
        m_new = m_tile
        l_old = 0.0
    else:
        m_new = xp.maximum(st[:, 0], m_tile)
        finite = xp.isfinite(m_new)
        l_old = st[:, 1] * xp.where(finite, xp.exp(st[:, 0] - xp.where(finite, m_new, 0)), 0)
    shift = xp.where(xp.isfinite(m_new), m_new, 0)
    l_tile = xp.exp(sv - shift[:, None]).sum(axis=1)
    st[:, 0] = m_new
    st[:, 1] = l_old + l_tile


@kernel("softmax_apply", "stats:R s:RW", "rows cols", lambda p: _rc(p, 3.0))
def softmax_apply(xp, bufs, p):
    """s <- exp(s - m) / l in place: scores become probabilities."""
    stats, s = bufs
    sv = s.reshape((int(p.rows), int(p.cols)))
    st = stats.reshape((int(p.rows), 2))
    sv -= st[:, 0:1]
    xp.exp(sv, out=sv)
    sv /= st[:, 1:2]


@kernel("softmax_bwd", "p:R dp:RW d:R", "rows cols alpha", lambda p: _rc(p, 3.0))
def softmax_bwd(xp, bufs, p):
    """dp <- alpha * p * (dp - d[row]) in place, d[row] = sum_k p * dp over the whole row."""
    pr, dp, d = bufs
    rows, cols = int(p.rows), int(p.cols)
    dv = dp.reshape((rows, cols))
    dv -= d.reshape((rows, 1))
    dv *= pr.reshape((rows, cols))
    if p.alpha != 1.0:
        dv *= dp.dtype.type(p.alpha)
