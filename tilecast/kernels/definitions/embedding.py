"""Token and position embeddings, with the token table split into vocabulary tiles."""

from tilecast.kernels.registry import kernel


@kernel("embed", "ids:R w:R x:RW", "tokens vt et v0 beta", lambda p: 0.0 * p["tokens"])
def embed(xp, bufs, p):
    """x[t] = beta * x[t] + w[ids[t] - v0] for ids in [v0, v0 + vt); other rows get beta * x[t]."""
    ids, w, x = bufs
    tokens, vt, et = int(p.tokens), int(p.vt), int(p.et)
    xv = x.reshape((tokens, et))
    wv = w.reshape((vt, et))
    local = ids - int(p.v0)
    hit = (local >= 0) & (local < vt)
    if p.beta == 0.0:
        xv[...] = 0
    xv[hit] += wv[local[hit]]


@kernel("embed_bwd", "ids:R dx:R dw:RW", "tokens vt et v0 beta", lambda p: 1.0 * p["tokens"] * p["et"])
def embed_bwd(xp, bufs, p):
    """dw[ids[t] - v0] (+)= dx[t] for ids in this vocabulary tile (scatter-add)."""
    ids, dx, dw = bufs
    tokens, vt, et = int(p.tokens), int(p.vt), int(p.et)
    dwv = dw.reshape((vt, et))
    if p.beta == 0.0:
        dwv[...] = 0
    local = ids - int(p.v0)
    hit = (local >= 0) & (local < vt)
    xp.add.at(dwv, local[hit], dx.reshape((tokens, et))[hit])


@kernel("pos_add", "wpe:R x:RW", "bt st et", lambda p: 1.0 * p["bt"] * p["st"] * p["et"])
def pos_add(xp, bufs, p):
    """x (bt, st, et) += wpe (st, et) broadcast over the batch."""
    wpe, x = bufs
    x.reshape((int(p.bt), int(p.st), int(p.et)))[...] += wpe.reshape((int(p.st), int(p.et)))


@kernel("pos_bwd", "dx:R dwpe:RW", "bt st et beta", lambda p: 1.0 * p["bt"] * p["st"] * p["et"])
def pos_bwd(xp, bufs, p):
    """dwpe (st, et) (+)= sum over the batch of dx (bt, st, et)."""
    dx, dwpe = bufs
    s = dx.reshape((int(p.bt), int(p.st), int(p.et))).sum(axis=0)
    if p.beta == 0.0:
        dwpe.reshape((int(p.st), int(p.et)))[...] = s
    else:
        dwpe.reshape((int(p.st), int(p.et)))[...] += s
