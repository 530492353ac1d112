"""Tiled operations: each call appends the tasks of one whole operation to a builder.

Activations are (batch, seq, features...) tensors whose tiles, seen as
matrices, have bt*st rows (tokens) and the tile's feature size as columns;
only the first feature axis is ever tiled (e.g. heads of (head, head_dim)).
Loops are laid out with numpy, innermost index last, so the reduction index of
an accumulation is innermost and its first task overwrites (see
``GraphBuilder.accumulate``).
"""

from __future__ import annotations

import math

import numpy as np

from tilecast.graph.builder import GraphBuilder
from tilecast.graph.tensor import Tensor


def mesh(*sizes) -> list[np.ndarray]:
    """Row-major index arrays over a grid (the last index varies fastest)."""
    return [a.ravel() for a in np.indices(sizes, dtype=np.int64)]


def _feat(t: Tensor, axis: int, coord) -> np.ndarray:
    """Tile size along ``axis`` times the (untiled) axes after it."""
    return t.extent(axis, coord) * int(np.prod(t.shape[axis + 1:], dtype=np.int64))


def _tok(t: Tensor, b, s) -> np.ndarray:
    return t.extent(0, b) * t.extent(1, s)


def _ids(t: Tensor, *coords) -> np.ndarray:
    """Tile ids with untiled trailing axes at coordinate 0."""
    return t.tile_ids(*coords, *([0] * (len(t.shape) - len(coords))))


def _w_ids(w: Tensor, k, n, n_in: int) -> np.ndarray:
    coords = [k] + [0] * (n_in - 1) + [n] + [0] * (len(w.shape) - n_in - 1)
    return w.tile_ids(*coords)


def gemm(bld: GraphBuilder, a, b, c, trans_a, trans_b, m, n, k, alpha=1.0) -> None:
    beta, mode = bld.accumulate(c)
    bld.add("gemm", [a, b, c], dict(trans_a=trans_a, trans_b=trans_b, m=m, n=n, k=k, alpha=alpha, beta=beta),
            modes=[None, None, mode])


# --- linear layers: y = x @ w + bias, w stored (in..., out...) ---------------

def linear(bld: GraphBuilder, x: Tensor, w: Tensor, bias: Tensor | None, y: Tensor) -> None:
    n_in = len(x.shape) - 2
    nb, ns, nk = x.grid[:3]
    nn = y.grid[2]
    b, s, n, k = mesh(nb, ns, nn, nk)
    gemm(bld, _ids(x, b, s, k), _w_ids(w, k, n, n_in), _ids(y, b, s, n), 0, 0,
         _tok(x, b, s), _feat(y, 2, n), _feat(x, 2, k))
    if bias is not None:
        b, s, n = mesh(nb, ns, nn)
        bld.add("bias_add", [_ids(bias, n), _ids(y, b, s, n)], dict(m=_tok(y, b, s), n=_feat(y, 2, n)))


def linear_backward(bld: GraphBuilder, x: Tensor, w: Tensor, dy: Tensor, dx: Tensor | None,
                    dw: Tensor, dbias: Tensor | None) -> None:
    """dw += x^T dy, dbias += colsum(dy), dx (+)= dy w^T."""
    n_in = len(x.shape) - 2
    nb, ns, nk = x.grid[:3]
    nn = dy.grid[2]
    k, n, b, s = mesh(nk, nn, nb, ns)
    gemm(bld, _ids(x, b, s, k), _ids(dy, b, s, n), _w_ids(dw, k, n, n_in), 1, 0,
         _feat(x, 2, k), _feat(dy, 2, n), _tok(x, b, s))
    if dbias is not None:
        n, b, s = mesh(nn, nb, ns)
        out = _ids(dbias, n)
        beta, mode = bld.accumulate(out)
        bld.add("bias_grad", [_ids(dy, b, s, n), out], dict(m=_tok(dy, b, s), n=_feat(dy, 2, n), beta=beta),
                modes=[None, mode])
    if dx is not None:
        b, s, k, n = mesh(nb, ns, nk, nn)
        gemm(bld, _ids(dy, b, s, n), _w_ids(w, k, n, n_in), _ids(dx, b, s, k), 0, 1,
             _tok(dy, b, s), _feat(dx, 2, k), _feat(dy, 2, n))


# --- layer normalisation over embd --------------------------------------------

def layernorm(bld: GraphBuilder, x: Tensor, gamma: Tensor, beta_: Tensor, stats: Tensor, y: Tensor,
              eps: float) -> None:
    nb, ns, ne = x.grid
    b, s, e = mesh(nb, ns, ne)
    out = _ids(stats, b, s)
    beta, mode = bld.accumulate(out)
    rows, cols = _tok(x, b, s), x.extent(2, e)
    bld.add("ln_stats", [_ids(x, b, s, e), out], dict(rows=rows, cols=cols, count=x.start(2, e), beta=beta),
            modes=[None, mode])
    bld.add("ln_apply", [_ids(x, b, s, e), out, _ids(gamma, e), _ids(beta_, e), _ids(y, b, s, e)],
            dict(rows=rows, cols=cols, n=x.shape[2], eps=eps))


def layernorm_backward(bld: GraphBuilder, x: Tensor, gamma: Tensor, stats: Tensor, dy: Tensor, sums: Tensor,
                       dx: Tensor, dgamma: Tensor, dbeta: Tensor, eps: float) -> None:
    nb, ns, ne = x.grid
    b, s, e = mesh(nb, ns, ne)
    rows, cols = _tok(x, b, s), x.extent(2, e)
    common = dict(rows=rows, cols=cols, n=x.shape[2], eps=eps)
    sum_ids = _ids(sums, b, s)
    beta, mode = bld.accumulate(sum_ids)
    xs, st, g, d = _ids(x, b, s, e), _ids(stats, b, s), _ids(gamma, e), _ids(dy, b, s, e)
    bld.add("ln_bwd_sums", [xs, st, g, d, sum_ids], dict(common, beta=beta), modes=[None] * 4 + [mode])
    dx_ids = _ids(dx, b, s, e)
    beta, mode = bld.accumulate(dx_ids)
    bld.add("ln_bwd_dx", [xs, st, g, d, sum_ids, dx_ids], dict(common, beta=beta), modes=[None] * 5 + [mode])
    e, b, s = mesh(ne, nb, ns)
    dg, db = _ids(dgamma, e), _ids(dbeta, e)
    beta, mode_g = bld.accumulate(dg)
    _, mode_b = bld.accumulate(db)
    bld.add("ln_bwd_params", [_ids(x, b, s, e), _ids(stats, b, s), _ids(dy, b, s, e), dg, db],
            dict(rows=_tok(x, b, s), cols=x.extent(2, e), n=x.shape[2], eps=eps, beta=beta),
            modes=[None, None, None, mode_g, mode_b])


# --- causal self-attention ------------------------------------------------------

def _pairs(nb, nh, nq):
    """(b, h, qi, kj) over the causal lower triangle of seq tiles, kj innermost."""
    qi, kj = np.tril_indices(nq)
    b, h, p = mesh(nb, nh, len(qi))
    return b, h, qi[p], kj[p]


def _causal(q: Tensor, k: Tensor, qi, kj) -> dict:
    """Parameters of a product with probabilities that skips their masked entries (keys after the query)."""
    return dict(q0=q.start(1, qi), k0=k.start(1, kj), causal=1)


def attention_probs(bld: GraphBuilder, q: Tensor, k: Tensor, scores: Tensor, stats: Tensor) -> None:
    """scores = softmax(q k^T / sqrt(d) + causal mask), each row's (max, sum) into ``stats``."""
    nb, ns, nh = q.grid[:3]
    d = q.shape[3]
    b, h, qi, kj = _pairs(nb, nh, ns)
    # The first query tile sees only the first key tile: its rows are whole there, and its softmax is
    # computed in the task that computes its scores (no statistics to merge across tiles).
    whole = qi == 0
    for sel in (whole, ~whole):
        if not sel.any():
            continue
        bs, hs, qs, ks = b[sel], h[sel], qi[sel], kj[sel]
        dims = dict(bt=q.extent(0, bs), ht=q.extent(2, hs), sq=q.extent(1, qs), sk=k.extent(1, ks), d=d)
        qk = [_ids(q, bs, qs, hs), _ids(k, bs, ks, hs), scores.tile_ids(bs, hs, qs, ks)]
        qk_params = dict(dims, alpha=1.0 / math.sqrt(d), q0=q.start(1, qs), k0=k.start(1, ks), causal=1)
        st_ids = _ids(stats, bs, hs, qs)
        beta, mode = bld.accumulate(st_ids)
        if sel is whole:
            bld.add("attn_qk_softmax", qk + [st_ids], qk_params, modes=[None, None, None, mode])
            continue
        bld.add("attn_qk", qk, qk_params)
        rows = dims["bt"] * dims["ht"] * dims["sq"]
        bld.add("softmax_stats", [qk[2], st_ids], dict(rows=rows, cols=dims["sk"], beta=beta), modes=[None, mode])
        bld.add("softmax_apply", [st_ids, qk[2]], dict(rows=rows, cols=dims["sk"]))


def attention(bld: GraphBuilder, q: Tensor, k: Tensor, v: Tensor, scores: Tensor, stats: Tensor,
              o: Tensor) -> None:
    """o = softmax(q k^T / sqrt(d) + causal mask) v; ``scores`` end up holding the probabilities."""
    attention_probs(bld, q, k, scores, stats)
    nb, ns, nh = q.grid[:3]
    d = q.shape[3]
    b, h, qi, kj = _pairs(nb, nh, ns)
    dims = dict(bt=q.extent(0, b), ht=q.extent(2, h), sq=q.extent(1, qi), sk=k.extent(1, kj), d=d)
    s_ids = scores.tile_ids(b, h, qi, kj)
    o_ids = _ids(o, b, qi, h)
    beta, mode = bld.accumulate(o_ids)
    bld.add("attn_pv", [s_ids, _ids(v, b, kj, h), o_ids], dict(dims, alpha=1.0, beta=beta, **_causal(q, k, qi, kj)),
            modes=[None, None, mode])


def attention_backward(bld: GraphBuilder, q: Tensor, k: Tensor, v: Tensor, probs: Tensor, o: Tensor,
                       do: Tensor, rowdot: Tensor, dprobs: Tensor, dq: Tensor, dk: Tensor, dv: Tensor) -> None:
    nb, ns, nh = q.grid[:3]
    d = q.shape[3]
    b, h, qi = mesh(nb, nh, ns)
    bld.add("attn_rowdot", [_ids(do, b, qi, h), _ids(o, b, qi, h), _ids(rowdot, b, h, qi)],
            dict(bt=q.extent(0, b), sq=q.extent(1, qi), ht=q.extent(2, h), dh=d))
    b, h, qi, kj = _pairs(nb, nh, ns)
    dims = dict(bt=q.extent(0, b), ht=q.extent(2, h), sq=q.extent(1, qi), sk=k.extent(1, kj), d=d)
    masked = _causal(q, k, qi, kj)
    p_ids, dp_ids = probs.tile_ids(b, h, qi, kj), dprobs.tile_ids(b, h, qi, kj)
    do_q, q_q, k_k, v_k = _ids(do, b, qi, h), _ids(q, b, qi, h), _ids(k, b, kj, h), _ids(v, b, kj, h)
    # dP whole (its masked entries meet zero probabilities in softmax_bwd): skipping them in blocks costs more
    # than it saves at a head dimension of 64 (the blocks' products are short)
    bld.add("attn_qk", [do_q, v_k, dp_ids], dict(dims, alpha=1.0, q0=0, k0=0, causal=0))
    bld.add("softmax_bwd", [p_ids, dp_ids, _ids(rowdot, b, h, qi)],
            dict(rows=dims["bt"] * dims["ht"] * dims["sq"], cols=dims["sk"], alpha=1.0 / math.sqrt(d)))
    # Reductions over query tiles (dv, dk) want qi innermost; over key tiles (dq) kj innermost.
    order = np.lexsort((qi, kj, h, b))
    ob = {name: arr[order] for name, arr in {**dims, **masked}.items() if np.ndim(arr)}
    dims_k = {**dims, **masked, **ob}
    dv_ids = _ids(dv, b, kj, h)[order]
    beta, mode = bld.accumulate(dv_ids)
    bld.add("attn_ptv", [p_ids[order], do_q[order], dv_ids], dict(dims_k, alpha=1.0, beta=beta),
            modes=[None, None, mode])
    dq_ids = _ids(dq, b, qi, h)
    beta, mode = bld.accumulate(dq_ids)
    bld.add("attn_pv", [dp_ids, k_k, dq_ids], dict(dims, alpha=1.0, beta=beta, **masked), modes=[None, None, mode])
    dk_ids = _ids(dk, b, kj, h)[order]
    beta, mode = bld.accumulate(dk_ids)
    bld.add("attn_ptv", [dp_ids[order], q_q[order], dk_ids], dict(dims_k, alpha=1.0, beta=beta),
            modes=[None, None, mode])


# --- element-wise ------------------------------------------------------------------

def tile_sizes(t: Tensor) -> np.ndarray:
    return t.tile_elements()


def all_tiles(t: Tensor) -> np.ndarray:
    return np.arange(t.first_tile, t.first_tile + t.n_tiles, dtype=np.int64)


def gelu(bld: GraphBuilder, x: Tensor, y: Tensor) -> None:
    bld.add("gelu", [all_tiles(x), all_tiles(y)], dict(n=tile_sizes(x)))


def gelu_backward(bld: GraphBuilder, x: Tensor, dy: Tensor) -> None:
    bld.add("gelu_bwd", [all_tiles(x), all_tiles(dy)], dict(n=tile_sizes(x)))


def add_into(bld: GraphBuilder, x: Tensor, y: Tensor) -> None:
    """y += x, tile by tile (same tiling)."""
    bld.add("axpy", [all_tiles(x), all_tiles(y)], dict(n=tile_sizes(x), alpha=1.0))


def fill(bld: GraphBuilder, tiles: np.ndarray, sizes: np.ndarray, value: float = 0.0) -> None:
    bld.accumulate(tiles)
    bld.add("fill", [tiles], dict(n=sizes, value=value))
