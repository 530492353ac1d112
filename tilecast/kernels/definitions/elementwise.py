"""Element-wise and broadcast kernels: fill, axpy, bias, GELU."""

import math

from tilecast.kernels.registry import kernel

# GPT-2's tanh approximation of GELU ("gelu_new" in transformers):
# 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  (Hendrycks & Gimpel 2016).
_C = math.sqrt(2.0 / math.pi)
_A = 0.044715


@kernel("fill", "x:W", "n value", lambda p: 0.0 * p["n"])
def fill(xp, bufs, p):
    """x[:] = value."""
    bufs[0][...] = p.value


@kernel("axpy", "x:R y:RW", "n alpha", lambda p: 2.0 * p["n"])
def axpy(xp, bufs, p):
    """y += alpha * x."""
    x, y = bufs
    if p.alpha == 1.0:
        y += x
    else:
        y += y.dtype.type(p.alpha) * x


@kernel("bias_add", "b:R y:RW", "m n", lambda p: 1.0 * p["m"] * p["n"])
def bias_add(xp, bufs, p):
    """y (m x n) += b (n) broadcast over rows."""
    b, y = bufs
    y.reshape((int(p.m), int(p.n)))[...] += b


@kernel("bias_grad", "dy:R db:RW", "m n beta", lambda p: 1.0 * p["m"] * p["n"])
def bias_grad(xp, bufs, p):
    """db (n) = beta * db + sum over rows of dy (m x n)."""
    dy, db = bufs
    s = dy.reshape((int(p.m), int(p.n))).sum(axis=0)
    if p.beta == 0.0:
        db[...] = s
    else:
        db += s


def _gelu_flops(p):
    return 8.0 * p["n"]


@kernel("gelu", "x:R y:W", "n", _gelu_flops)
def gelu(xp, bufs, p):
    """y = gelu_tanh(x)."""
    x, y = bufs
    y[...] = 0.5 * x * (1.0 + xp.tanh(x.dtype.type(_C) * (x + x.dtype.type(_A) * x * x * x)))


@kernel("gelu_bwd", "x:R dy:RW", "n", lambda p: 14.0 * p["n"])
def gelu_bwd(xp, bufs, p):
    """dy <- dy * gelu_tanh'(x), in place."""
    x, dy = bufs
    c = x.dtype.type(_C)
    a = x.dtype.type(_A)
    t = xp.tanh(c * (x + a * x * x * x))
    d = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * a * x * x)
    dy *= d
