"""Mean next-token cross-entropy over logits split into vocabulary tiles.

loss = mean over tokens of (m + log l - logit[target]), where (m, l) are the
softmax stats of the token's logits row (see softmax.py).
"""

from tilecast.kernels.registry import kernel


@kernel("ce_target", "logits:R targets:R picked:RW", "rows vt v0 beta", lambda p: 0.0 * p["rows"])
def ce_target(xp, bufs, p):
    """picked[row] (+)= logits[row, target - v0] when the target falls in this vocabulary tile."""
    logits, targets, picked = bufs
    rows, vt = int(p.rows), int(p.vt)
    lv = logits.reshape((rows, vt))
    local = targets - int(p.v0)
    hit = (local >= 0) & (local < vt)
    if p.beta == 0.0:
        picked[...] = 0
    picked[hit] += lv[xp.nonzero(hit)[0], local[hit]]


@kernel("ce_loss", "stats:R picked:R loss:RW", "rows scale beta", lambda p: 4.0 * p["rows"])
def ce_loss(xp, bufs, p):
    """loss (+)= scale * sum over rows of (m + log l - picked)."""
    stats, picked, loss = bufs
    st = stats.reshape((int(p.rows), 2))
    part = (st[:, 0] + xp.log(st[:, 1]) - picked).sum(dtype=xp.float64) * p.scale
    if p.beta == 0.0:
        loss[0] = part
    else:
        loss[0] += part


@kernel("ce_grad", "logits:RW stats:R targets:R", "rows vt v0 scale", lambda p: 4.0 * p["rows"] * p["vt"])
def ce_grad(xp, bufs, p):
    """logits <- scale * (softmax(logits) - onehot(target)) in place (d loss / d logits)."""
    logits, stats, targets = bufs
    rows, vt = int(p.rows), int(p.vt)
    lv = logits.reshape((rows, vt))
    st = stats.reshape((rows, 2))
    lv -= st[:, 0:1]
    xp.exp(lv, out=lv)
    lv /= st[:, 1:2]
    local = targets - int(p.v0)
    hit = (local >= 0) & (local < vt)
    lv[xp.nonzero(hit)[0], local[hit]] -= 1.0
    lv *= logits.dtype.type(p.scale)
