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


# Gathers and scatter-adds are memory-bound; their few additions (tokens x et over all
# vocabulary tiles together, unknown per tile) are not counted as flops.
@kernel("embed_bwd", "ids:R dx:R dw:RW", "tokens vt et v0 beta", lambda p: 0.0 * p["tokens"])
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
    """x (bt, st, et) += the first st rows of wpe (rows, et), broadcast over the batch.

    A position tile can hold more rows than the sequence tile it feeds (the
    last sequence tile is shorter; n_positions is longer than the sequence).
    """
    wpe, x = bufs
    st, et = int(p.st), int(p.et)
    x.reshape((int(p.bt), st, et))[...] += wpe[: st * et].reshape((st, et))


@kernel("pos_bwd", "dx:R dwpe:RW", "bt st et beta", lambda p: 1.0 * p["bt"] * p["st"] * p["et"])
def pos_bwd(xp, bufs, p):
    """The first st rows of dwpe (rows, et) (+)= sum over the batch of dx (bt, st, et)."""
    dx, dwpe = bufs
    st, et = int(p.st), int(p.et)
    s = dx.reshape((int(p.bt), st, et)).sum(axis=0)
    head = dwpe[: st * et].reshape((st, et))
    if p.beta == 0.0:
        head[...] = s
    else:
        head += s
