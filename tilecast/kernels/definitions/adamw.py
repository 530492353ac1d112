"""AdamW update of one parameter tile, as torch.optim.AdamW computes it.

Decoupled weight decay (Loshchilov & Hutter 2019): p <- p * (1 - lr * wd), then
the bias-corrected Adam step p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps),
with sqrt(v) multiplied by the float32 1 / sqrt(1 - b2^t) (one division per entry, as the C kernel).
"""

import math

from tilecast.kernels.registry import kernel


@kernel("adamw", "p:RW g:R m:RW v:RW", "n lr beta1 beta2 eps weight_decay step", lambda p: 12.0 * p["n"])
def adamw(xp, bufs, p):
    """One AdamW step at step number ``step`` (1-based)."""
    w, g, m, v = bufs
    f = w.dtype.type
    w *= f(1.0 - p.lr * p.weight_decay)
    m *= f(p.beta1)
    m += f(1.0 - p.beta1) * g
    v *= f(p.beta2)
    v += f(1.0 - p.beta2) * g * g
    bias1 = 1.0 - p.beta1 ** p.step
    bias2 = 1.0 - p.beta2 ** p.step
    denom = xp.sqrt(v) * f(1.0 / math.sqrt(bias2)) + f(p.eps)
    w -= f(p.lr / bias1) * (m / denom)
