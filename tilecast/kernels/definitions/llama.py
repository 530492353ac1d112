"""Kernels of the Llama family: RMSNorm, rotary position embedding, SwiGLU, and the
copy of key/value heads to the query heads that share them (grouped-query attention).

RMSNorm (Zhang & Sennrich 2019): y = x / sqrt(mean(x^2) + eps) * gamma. A row's
sum of squares is accumulated across embedding tiles (``rms_stats``), as the
LayerNorm statistics are merged (layernorm.py).

RoPE (Su et al. 2021, "RoFormer"), in the half-split layout Llama uses: the two
halves (x1, x2) of a head's vector at position t rotate by the angles
t * theta^(-2i/d), i < d/2: (x1 cos - x2 sin, x2 cos + x1 sin). A longer context
rescales the frequencies (linear or Llama 3.1's scaling, :func:`rope_inv_freq`).
The angles are computed in the tile's precision (in float32 as transformers
computes them).
The backward pass is the rotation by the opposite angles (``sign`` -1).

SwiGLU (Shazeer 2020, "GLU variants improve Transformer"): silu(gate) * up.
"""

import numpy as np

from tilecast.kernels.registry import kernel


def _rows(x, p):
    return x.reshape((int(p.rows), int(p.cols)))


def _rstd(xp, stats, p, dtype):
    """1 / sqrt(mean(x^2) + eps) per row, (rows x 1)."""
    ss = stats.reshape((int(p.rows), 1))
    return 1.0 / xp.sqrt(ss / dtype.type(p.n) + dtype.type(p.eps))


@kernel("rms_stats", "x:R stats:RW", "rows cols beta", lambda p: 2.0 * p["rows"] * p["cols"])
def rms_stats(xp, bufs, p):
    """stats[row] (+)= sum of x^2 over the tile's columns (a row's sum of squares, merged across tiles)."""
    x, stats = bufs
    xv = _rows(x, p)
    ss = (xv * xv).sum(axis=1)
    if p.beta == 0.0:
        stats[...] = ss
    else:
        stats += ss


@kernel("rms_apply", "x:R stats:R gamma:R y:W", "rows cols n eps", lambda p: 3.0 * p["rows"] * p["cols"])
def rms_apply(xp, bufs, p):
    """y = x / sqrt(ss / n + eps) * gamma, n = full row length."""
    x, stats, gamma, y = bufs
    _rows(y, p)[...] = (_rows(x, p) * _rstd(xp, stats, p, x.dtype)) * gamma


@kernel("rms_bwd_sums", "x:R gamma:R dy:R sums:RW", "rows cols beta", lambda p: 3.0 * p["rows"] * p["cols"])
def rms_bwd_sums(xp, bufs, p):
    """sums[row] (+)= sum of dy * gamma * x over the tile's columns."""
    x, gamma, dy, sums = bufs
    s = (_rows(dy, p) * gamma * _rows(x, p)).sum(axis=1)
    if p.beta == 0.0:
        sums[...] = s
    else:
        sums += s


@kernel("rms_bwd_dx", "x:R stats:R gamma:R dy:R sums:R dx:RW", "rows cols n eps beta",
        lambda p: 5.0 * p["rows"] * p["cols"])
def rms_bwd_dx(xp, bufs, p):
    """dx (+)= r * dy * gamma - x * r^3 * sums / n, r = 1 / sqrt(ss / n + eps)."""
    x, stats, gamma, dy, sums, dx = bufs
    r = _rstd(xp, stats, p, x.dtype)
    c = r * r * r * sums.reshape((int(p.rows), 1)) / x.dtype.type(p.n)
    d = r * (_rows(dy, p) * gamma) - _rows(x, p) * c
    if p.beta == 0.0:
        _rows(dx, p)[...] = d
    else:
        _rows(dx, p)[...] += d


@kernel("rms_bwd_gamma", "x:R stats:R dy:R dgamma:RW", "rows cols n eps beta", lambda p: 3.0 * p["rows"] * p["cols"])
def rms_bwd_gamma(xp, bufs, p):
    """dgamma (+)= sum over rows of dy * x * r."""
    x, stats, dy, dgamma = bufs
    dg = (_rows(dy, p) * (_rows(x, p) * _rstd(xp, stats, p, x.dtype))).sum(axis=0)
    if p.beta == 0.0:
        dgamma[...] = dg
    else:
        dgamma += dg


def rope_inv_freq(d, theta, factor=1.0, low_freq=0.0, high_freq=0.0, orig_pos=0.0, dtype=np.float32):
    """The d/2 inverse frequencies theta^(-2i/d), rescaled for a longer context, in ``dtype``.

    ``factor`` 1: unscaled. ``orig_pos`` 0: linear scaling (every frequency divided by ``factor``).
    Otherwise Llama 3.1's scaling (transformers' rope_type "llama3"): with the wavelength 2 pi / f,
    wavelengths below orig_pos / high_freq are kept, those above orig_pos / low_freq are divided
    by ``factor``, and those between interpolated, s = (orig_pos / wavelength - low_freq) /
    (high_freq - low_freq), f' = (1 - s) f / factor + s f. Computed step by step in ``dtype``, in
    the order transformers computes them in float32.
    """
    t = np.dtype(dtype).type
    power = (np.float64(theta) ** (np.arange(0, int(d), 2, dtype=dtype) / t(d)).astype(np.float64)).astype(dtype)
    inv = (t(1.0) / power).astype(dtype)  # theta^(2i/d) rounded once from float64, as torch computes it
    if factor == 1.0:
        return inv
    scaled = (inv / t(factor)).astype(dtype)
    if orig_pos == 0.0:
        return scaled
    wavelen = (t(2.0 * np.pi) / inv).astype(dtype)
    low = np.where(wavelen > t(orig_pos / low_freq), scaled, inv).astype(dtype)
    s = ((t(orig_pos) / wavelen - t(low_freq)) / t(high_freq - low_freq)).astype(dtype)
    smooth = ((t(1.0) - s) * low / t(factor) + s * low).astype(dtype)
    medium = ~(wavelen < t(orig_pos / high_freq)) & ~(wavelen > t(orig_pos / low_freq))
    return np.where(medium, smooth, low).astype(dtype)


def rope_angles(xp, st, d, s0, inv, dtype=np.float32):
    """(cos, sin), each (st, d/2) in ``dtype``, of positions s0 .. s0 + st - 1 at inverse frequencies ``inv``."""
    f = np.dtype(dtype).type
    pos = (np.arange(int(st), dtype=dtype) + f(s0))[:, None]
    ang = (pos * inv[None, :]).astype(dtype)
    return xp.asarray(np.cos(ang)), xp.asarray(np.sin(ang))


@kernel("rope", "x:RW", "bt st ht d s0 theta sign factor low_freq high_freq orig_pos",
        lambda p: 3.0 * p["bt"] * p["st"] * p["ht"] * p["d"])
def rope(xp, bufs, p):
    """Rotate a (bt, st, ht, d) tile in place by position (s0 + row) angles; sign -1 rotates back.

    The frequencies are :func:`rope_inv_freq` of (d, theta, factor, low_freq, high_freq, orig_pos)."""
    (x,) = bufs
    d, half = int(p.d), int(p.d) // 2
    xv = x.reshape((int(p.bt), int(p.st), int(p.ht), d))
    inv = rope_inv_freq(d, p.theta, p.factor, p.low_freq, p.high_freq, p.orig_pos, x.dtype)
    cos, sin = rope_angles(xp, p.st, d, p.s0, inv, x.dtype)
    cos = cos[None, :, None, :]
    sin = (sin * x.dtype.type(p.sign))[None, :, None, :]
    x1 = xv[..., :half].copy()
    x2 = xv[..., half:].copy()
    xv[..., :half] = x1 * cos - x2 * sin
    xv[..., half:] = x2 * cos + x1 * sin


@kernel("swiglu", "g:R u:R y:W", "n", lambda p: 6.0 * p["n"])
def swiglu(xp, bufs, p):
    """y = silu(g) * u = g / (1 + exp(-g)) * u."""
    g, u, y = bufs
    y[...] = g / (1.0 + xp.exp(-g)) * u


@kernel("swiglu_bwd", "g:R u:R dy:R dg:W du:W", "n", lambda p: 10.0 * p["n"])
def swiglu_bwd(xp, bufs, p):
    """du = dy * silu(g); dg = dy * u * s * (1 + g * (1 - s)), s = sigmoid(g)."""
    g, u, dy, dg, du = bufs
    s = 1.0 / (1.0 + xp.exp(-g))
    du[...] = dy * (g * s)
    dg[...] = dy * u * (s * (1.0 + g * (1.0 - s)))


def _kv_shapes(p):
    bt, st, kt, g, d = (int(p.bt), int(p.st), int(p.kt), int(p.g), int(p.d))
    return (bt, st, kt, d), (bt, st, kt, g, d)


@kernel("kv_expand", "x:R y:W", "bt st kt g d", lambda p: 0.0 * p["bt"])
def kv_expand(xp, bufs, p):
    """y (bt, st, kt * g, d): each of x's kt key/value heads copied to its g query heads."""
    x, y = bufs
    xs, ys = _kv_shapes(p)
    y.reshape(ys)[...] = x.reshape(xs)[:, :, :, None, :]


@kernel("kv_reduce", "y:R x:RW", "bt st kt g d beta", lambda p: 1.0 * p["bt"] * p["st"] * p["kt"] * p["g"] * p["d"])
def kv_reduce(xp, bufs, p):
    """x (bt, st, kt, d) (+)= the sum over each key/value head's g query heads of y (bt, st, kt * g, d)."""
    y, x = bufs
    xs, ys = _kv_shapes(p)
    s = y.reshape(ys).sum(axis=3)
    if p.beta == 0.0:
        x.reshape(xs)[...] = s
    else:
        x.reshape(xs)[...] += s
