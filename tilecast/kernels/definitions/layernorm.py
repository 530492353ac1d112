"""Layer normalisation over the last (embedding) axis, split across embedding tiles.

Statistics are merged tile by tile with the parallel-variance formula of
Chan, Golub & LeVeque (1979): per row (mean, M2), where M2 is the sum of
squared deviations; the variance is M2 / n.
"""

from tilecast.kernels.registry import kernel


def _rowwise(p, c):
    return c * p["rows"] * p["cols"]


def _view(x, p):
    return x.reshape((int(p.rows), int(p.cols)))


def _normalised(xp, x, stats, p):
    """(x - mean) * rstd and rstd, for a (rows x cols) tile."""
    st = stats.reshape((int(p.rows), 2))
    rstd = 1.0 / xp.sqrt(st[:, 1:2] / x.dtype.type(p.n) + x.dtype.type(p.eps))
    return (_view(x, p) - st[:, 0:1]) * rstd, rstd


@kernel("ln_stats", "x:R stats:RW", "rows cols count beta", lambda p: _rowwise(p, 4.0))
def ln_stats(xp, bufs, p):
    """Merge the (mean, M2) of a tile's rows into stats; ``count`` columns were merged before."""
    x, stats = bufs
    xv = _view(x, p)
    st = stats.reshape((int(p.rows), 2))
    mean_b = xv.mean(axis=1)
    m2_b = ((xv - mean_b[:, None]) ** 2).sum(axis=1)
    if p.beta == 0.0:
        st[:, 0] = mean_b
        st[:, 1] = m2_b
        return
    na, nb = p.count, p.cols
    n = na + nb
    delta = mean_b - st[:, 0]
    st[:, 0] += delta * x.dtype.type(nb / n)
    st[:, 1] += m2_b + delta * delta * x.dtype.type(na * nb / n)


@kernel("ln_apply", "x:R stats:R gamma:R beta:R y:W", "rows cols n eps", lambda p: _rowwise(p, 5.0))
def ln_apply(xp, bufs, p):
    """y = (x - mean) / sqrt(var + eps) * gamma + beta, n = full row length."""
    x, stats, gamma, beta, y = bufs
    xhat, _ = _normalised(xp, x, stats, p)
    _view(y, p)[...] = xhat * gamma + beta


@kernel("ln_bwd_sums", "x:R stats:R gamma:R dy:R sums:RW", "rows cols n eps beta", lambda p: _rowwise(p, 6.0))
def ln_bwd_sums(xp, bufs, p):
    """sums[row] (+)= (sum g, sum g * xhat) with g = dy * gamma."""
    x, stats, gamma, dy, sums = bufs
    xhat, _ = _normalised(xp, x, stats, p)
    g = _view(dy, p) * gamma
    sv = sums.reshape((int(p.rows), 2))
    s1 = g.sum(axis=1)
    s2 = (g * xhat).sum(axis=1)
    if p.beta == 0.0:
        sv[:, 0] = s1
        sv[:, 1] = s2
    else:
        sv[:, 0] += s1
        sv[:, 1] += s2


@kernel("ln_bwd_dx", "x:R stats:R gamma:R dy:R sums:R dx:RW", "rows cols n eps beta", lambda p: _rowwise(p, 8.0))
def ln_bwd_dx(xp, bufs, p):
    """dx = beta * dx + rstd * (g - mean(g) - xhat * mean(g * xhat))."""
    x, stats, gamma, dy, sums, dx = bufs
    xhat, rstd = _normalised(xp, x, stats, p)
    g = _view(dy, p) * gamma
    sv = sums.reshape((int(p.rows), 2))
    inv_n = x.dtype.type(1.0 / p.n)
    d = rstd * (g - sv[:, 0:1] * inv_n - xhat * (sv[:, 1:2] * inv_n))
    if p.beta == 0.0:
        _view(dx, p)[...] = d
    else:
        _view(dx, p)[...] += d


@kernel("ln_bwd_params", "x:R stats:R dy:R dgamma:RW dbeta:RW", "rows cols n eps beta", lambda p: _rowwise(p, 6.0))
def ln_bwd_params(xp, bufs, p):
    """dgamma (+)= sum over rows of dy * xhat; dbeta (+)= sum over rows of dy."""
    x, stats, dy, dgamma, dbeta = bufs
    xhat, _ = _normalised(xp, x, stats, p)
    dyv = _view(dy, p)
    dg = (dyv * xhat).sum(axis=0)
    db = dyv.sum(axis=0)
    if p.beta == 0.0:
        dgamma[...] = dg
        dbeta[...] = db
    else:
        dgamma += dg
        dbeta += db
