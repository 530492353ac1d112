"""Valid example tasks for every kernel: parameters and freshly filled buffers.

Used to check the C kernels against the numpy references and as inputs for
kernel microbenchmarks. ``sample_tasks(name, rng, dims)`` returns a list of
(params dict, buffers list) covering the kernel's flag combinations (transposes,
overwrite vs accumulate, causal masks...). ``dims`` sets the sizes; the default
``EVEN`` and ``UNEVEN`` sets mimic full and last (smaller) tiles.
"""

from __future__ import annotations

import numpy as np

from tilecast.kernels.registry import get

EVEN = dict(b=2, s=16, h=2, d=8, m=32, n=64, k=48, v=40, e=32)
UNEVEN = dict(b=3, s=13, h=3, d=5, m=19, n=37, k=23, v=29, e=21)


def _f(rng, *shape, scale=1.0):
    return (rng.standard_normal(int(np.prod(shape))) * scale).astype(np.float32)


def _stats_ln(rng, rows, count):
    """Plausible (mean, M2) of ``count`` earlier columns per row."""
    return np.stack([_f(rng, rows), rng.uniform(0.5, 2.0, rows).astype(np.float32) * count], 1).ravel()


def _stats_softmax(rng, rows):
    return np.stack([_f(rng, rows) + 2.0, rng.uniform(1.0, 5.0, rows).astype(np.float32)], 1).ravel()


def _ids(rng, n, high):
    return rng.integers(0, high, n).astype(np.int64)


def _gemm(rng, z):
    out = []
    m, n, k = z["m"], z["n"], z["k"]
    for ta in (0, 1):
        for tb in (0, 1):
            for alpha, beta in ((1.0, 0.0), (0.5, 1.0), (1.0, 0.25)):
                out.append((dict(trans_a=ta, trans_b=tb, m=m, n=n, k=k, alpha=alpha, beta=beta),
                            [_f(rng, m, k), _f(rng, k, n), _f(rng, m, n)]))
    return out


def _elementwise(name):
    def make(rng, z):
        n, m = z["n"], z["m"]
        if name == "fill":
            return [(dict(n=n, value=v), [_f(rng, n)]) for v in (0.0, -1.5)]
        if name == "axpy":
            return [(dict(n=n, alpha=a), [_f(rng, n), _f(rng, n)]) for a in (1.0, -0.3)]
        if name == "bias_add":
            return [(dict(m=m, n=n), [_f(rng, n), _f(rng, m, n)])]
        if name == "bias_grad":
            return [(dict(m=m, n=n, beta=b), [_f(rng, m, n), _f(rng, n)]) for b in (0.0, 1.0)]
        return [(dict(n=n), [_f(rng, n, scale=3.0), _f(rng, n)])]  # gelu, gelu_bwd
    return make


def _layernorm(name):
    def make(rng, z):
        rows, cols = z["m"], z["n"]
        out = []
        for beta in (0.0, 1.0):
            count = 3 * cols if beta else 0
            full = cols + count
            x = _f(rng, rows, cols, scale=2.0) + 0.5
            st = _stats_ln(rng, rows, full)
            g, bb, dy = _f(rng, cols), _f(rng, cols), _f(rng, rows, cols)
            sums = _f(rng, rows, 2)
            ln = dict(rows=rows, cols=cols, n=full, eps=1e-5)
            if name == "ln_stats":
                out.append((dict(rows=rows, cols=cols, count=count, beta=beta), [x, _stats_ln(rng, rows, max(count, 1))]))
            elif name == "ln_apply" and beta == 0.0:
                out.append((ln, [x, st, g, bb, _f(rng, rows, cols)]))
            elif name == "ln_bwd_sums":
                out.append((dict(ln, beta=beta), [x, st, g, dy, sums]))
            elif name == "ln_bwd_dx":
                out.append((dict(ln, beta=beta), [x, st, g, dy, sums, _f(rng, rows, cols)]))
            elif name == "ln_bwd_params":
                out.append((dict(ln, beta=beta), [x, st, dy, _f(rng, cols), _f(rng, cols)]))
        return out
    return make


def _softmax(name):
    def make(rng, z):
        rows, cols = z["m"], z["n"]
        s = _f(rng, rows, cols, scale=2.0)
        s[rng.random(rows * cols) < 0.2] = -np.inf  # masked scores
        s[:cols] = -np.inf  # one fully masked row
        if name == "softmax_stats":
            old = _stats_softmax(rng, rows)
            old[2] = -np.inf  # a row whose earlier tiles were all masked
            old[3] = 0.0
            return [(dict(rows=rows, cols=cols, beta=b), [s.copy(), old.copy()]) for b in (0.0, 1.0)]
        st = np.stack([np.max(np.where(np.isfinite(s), s, -50).reshape(rows, cols), 1),
                       rng.uniform(1, 5, rows)], 1).astype(np.float32).ravel()
        if name == "softmax_apply":
            return [(dict(rows=rows, cols=cols), [st, np.where(np.isfinite(s), s, -60).astype(np.float32)])]
        pr = rng.random(rows * cols).astype(np.float32)
        return [(dict(rows=rows, cols=cols, alpha=a), [pr, _f(rng, rows, cols), _f(rng, rows)]) for a in (1.0, 0.125)]
    return make


def _attention(name):
    def make(rng, z):
        bt, ht, d = z["b"], z["h"], z["d"]
        sq, sk = z["s"], z["s"] + 3
        tok = lambda s: _f(rng, bt, s, ht, d)  # noqa: E731
        if name == "attn_qk":
            cases = [(1.0, 0, 0, 0), (0.35, sk, 0, 1), (0.35, 5, 3, 1), (1.0, 0, 0, 1)]
            return [(dict(bt=bt, ht=ht, sq=sq, sk=sk, d=d, alpha=a, q0=q0, k0=k0, causal=c),
                     [tok(sq), tok(sk), _f(rng, bt, ht, sq, sk)]) for a, q0, k0, c in cases]
        if name == "attn_qk_softmax":  # tiles holding whole rows: every key of each query's row is here
            cases = [(0.35, 0, 0, 1), (1.0, 0, 0, 0), (0.35, sk, 0, 1)]
            return [(dict(bt=bt, ht=ht, sq=sq, sk=sk, d=d, alpha=a, q0=q0, k0=k0, causal=c),
                     [tok(sq), tok(sk), _f(rng, bt, ht, sq, sk), _f(rng, bt * ht * sq, 2)]) for a, q0, k0, c in cases]
        if name == "attn_rowdot":
            return [(dict(bt=bt, sq=sq, ht=ht, dh=d), [tok(sq), tok(sq), _f(rng, bt, ht, sq)])]
        pr = rng.random(bt * ht * sq * sk).astype(np.float32)
        out = []
        # whole tiles, the diagonal tile, one below it, one partly masked, one wholly masked, and a tile whose
        # masked entries hold NaN (they count as zero)
        cases = [(1.0, 0.0, 0, 0, 0), (0.5, 1.0, 0, 0, 0), (1.0, 0.0, 0, 0, 1), (0.5, 1.0, 0, 0, 1),
                 (1.0, 0.0, sk, 0, 1), (0.5, 1.0, 5, 3, 1), (1.0, 0.0, 0, sq + 2, 1), (0.5, 1.0, 0, sq + 2, 1),
                 (1.0, 0.0, 2, 9, 1)]
        for alpha, beta, q0, k0, c in cases:
            p = dict(bt=bt, ht=ht, sq=sq, sk=sk, d=d, alpha=alpha, beta=beta, q0=q0, k0=k0, causal=c)
            prc = pr.copy()
            if c and k0 == 9:
                masked = (np.arange(sk)[None, :] + k0) > (np.arange(sq)[:, None] + q0)
                prc.reshape(bt, ht, sq, sk)[..., masked] = np.nan
            bufs = [prc, tok(sk), tok(sq)] if name == "attn_pv" else [prc, tok(sq), tok(sk)]
            out.append((p, bufs))
        return out
    return make


def _embedding(name):
    def make(rng, z):
        tokens, vt, et = z["b"] * z["s"], z["v"], z["e"]
        out = []
        for v0, beta in ((0, 0.0), (vt, 1.0), (vt // 2, 0.0)):
            ids = _ids(rng, tokens, 2 * vt)
            p = dict(tokens=tokens, vt=vt, et=et, v0=v0, beta=beta)
            if name == "embed":
                out.append((p, [ids, _f(rng, vt, et), _f(rng, tokens, et)]))
            elif name == "embed_bwd":
                out.append((p, [ids, _f(rng, tokens, et), _f(rng, vt, et)]))
        bt, st = z["b"], z["s"]
        if name == "pos_add":
            # the position tile may hold more rows than the sequence tile it feeds
            out.append((dict(bt=bt, st=st, et=et), [_f(rng, st + 5, et), _f(rng, bt, st, et)]))
        if name == "pos_bwd":
            out += [(dict(bt=bt, st=st, et=et, beta=b), [_f(rng, bt, st, et), _f(rng, st + 5, et)]) for b in (0.0, 1.0)]
        return out
    return make


def _cross_entropy(name):
    def make(rng, z):
        rows, vt = z["b"] * z["s"], z["v"]
        logits = _f(rng, rows, vt, scale=3.0)
        st = np.stack([logits.reshape(rows, vt).max(1) + 0.5, rng.uniform(1, 5, rows)], 1).astype(np.float32).ravel()
        out = []
        for v0, beta in ((0, 0.0), (vt // 2, 1.0)):
            tg = _ids(rng, rows, 2 * vt)
            if name == "ce_target":
                out.append((dict(rows=rows, vt=vt, v0=v0, beta=beta), [logits, tg, _f(rng, rows)]))
            elif name == "ce_loss":
                out.append((dict(rows=rows, scale=1.0 / 7, beta=beta), [st, _f(rng, rows), _f(rng, 1)]))
            else:
                out.append((dict(rows=rows, vt=vt, v0=v0, scale=1.0 / rows), [logits.copy(), st, tg]))
        return out
    return make


def _adamw(rng, z):
    n = z["n"] * z["m"]
    return [(dict(n=n, lr=lr, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=wd, step=step),
             [_f(rng, n), _f(rng, n), _f(rng, n, scale=0.1), np.abs(_f(rng, n, scale=0.01))])
            for lr, wd, step in ((1e-3, 0.1, 1.0), (3e-4, 0.0, 17.0))]


def _llama(name):
    def make(rng, z):
        rows, cols = z["m"], z["n"]
        out = []
        for beta in (0.0, 1.0):
            n = cols * (4 if beta else 1)
            x, g, dy = _f(rng, rows, cols, scale=2.0), _f(rng, cols), _f(rng, rows, cols)
            ss = (rng.uniform(0.5, 4.0, rows) * n).astype(np.float32)
            sums = _f(rng, rows, scale=float(n))
            if name == "rms_stats":
                out.append((dict(rows=rows, cols=cols, beta=beta), [x, ss]))
            elif name == "rms_apply" and beta == 0.0:
                out.append((dict(rows=rows, cols=cols, n=n, eps=1e-5), [x, ss, g, _f(rng, rows, cols)]))
            elif name == "rms_bwd_sums":
                out.append((dict(rows=rows, cols=cols, beta=beta), [x, g, dy, sums]))
            elif name == "rms_bwd_dx":
                out.append((dict(rows=rows, cols=cols, n=n, eps=1e-5, beta=beta), [x, ss, g, dy, sums,
                                                                                   _f(rng, rows, cols)]))
            elif name == "rms_bwd_gamma":
                out.append((dict(rows=rows, cols=cols, n=n, eps=1e-5, beta=beta), [x, ss, dy, _f(rng, cols)]))
        bt, st, h, d = z["b"], z["s"], z["h"], 2 * z["d"]
        if name == "rope":
            unscaled = dict(factor=1.0, low_freq=0.0, high_freq=0.0, orig_pos=0.0)
            out += [(dict(bt=bt, st=st, ht=h, d=d, s0=s0, theta=theta, sign=sign, **unscaled), [_f(rng, bt, st, h, d)])
                    for s0, theta, sign in ((0, 10000.0, 1.0), (37, 500000.0, 1.0), (5, 10000.0, -1.0))]
            # linear and Llama 3.1 scalings (an original context of 16 and 64 positions puts frequencies in
            # each of the latter's three bands at these head sizes)
            out += [(dict(bt=bt, st=st, ht=h, d=d, s0=s0, theta=10000.0, sign=sign, factor=factor, low_freq=1.0,
                          high_freq=4.0, orig_pos=orig), [_f(rng, bt, st, h, d)])
                    for s0, sign, factor, orig in ((3, 1.0, 4.0, 0.0), (11, -1.0, 8.0, 16.0), (0, 1.0, 32.0, 64.0))]
        n = z["n"] * z["m"]
        if name == "swiglu":
            out.append((dict(n=n), [_f(rng, n, scale=4.0), _f(rng, n), _f(rng, n)]))
        if name == "swiglu_bwd":
            out.append((dict(n=n), [_f(rng, n, scale=4.0), _f(rng, n), _f(rng, n), _f(rng, n), _f(rng, n)]))
        for g in (1, 3):
            kv = dict(bt=bt, st=st, kt=h, g=g, d=z["d"])
            if name == "kv_expand":
                out.append((kv, [_f(rng, bt, st, h, z["d"]), _f(rng, bt, st, h * g, z["d"])]))
            if name == "kv_reduce":
                out += [(dict(kv, beta=b), [_f(rng, bt, st, h * g, z["d"]), _f(rng, bt, st, h, z["d"])])
                        for b in (0.0, 1.0)]
        if name == "kv_reduce":  # heads wider than the C kernel's block of 256 columns
            out.append((dict(bt=1, st=2, kt=2, g=3, d=300, beta=1.0), [_f(rng, 1, 2, 6, 300), _f(rng, 1, 2, 2, 300)]))
        return out
    return make


_MAKERS = {"gemm": _gemm, "adamw": _adamw}
for _n in ("rms_stats", "rms_apply", "rms_bwd_sums", "rms_bwd_dx", "rms_bwd_gamma", "rope", "swiglu", "swiglu_bwd",
           "kv_expand", "kv_reduce"):
    _MAKERS[_n] = _llama(_n)
for _n in ("fill", "axpy", "bias_add", "bias_grad", "gelu", "gelu_bwd"):
    _MAKERS[_n] = _elementwise(_n)
for _n in ("ln_stats", "ln_apply", "ln_bwd_sums", "ln_bwd_dx", "ln_bwd_params"):
    _MAKERS[_n] = _layernorm(_n)
for _n in ("softmax_stats", "softmax_apply", "softmax_bwd"):
    _MAKERS[_n] = _softmax(_n)
for _n in ("attn_qk", "attn_pv", "attn_ptv", "attn_rowdot", "attn_qk_softmax"):
    _MAKERS[_n] = _attention(_n)
for _n in ("embed", "embed_bwd", "pos_add", "pos_bwd"):
    _MAKERS[_n] = _embedding(_n)
for _n in ("ce_target", "ce_loss", "ce_grad"):
    _MAKERS[_n] = _cross_entropy(_n)


def sample_tasks(name: str, rng: np.random.Generator, dims: dict = EVEN) -> list[tuple[dict, list[np.ndarray]]]:
    """Example (params, buffers) of kernel ``name``; buffers are new arrays each call."""
    k = get(name)
    if name not in _MAKERS:
        raise KeyError(f"no sample tasks for kernel {name!r}")
    cases = _MAKERS[name](rng, dims)
    for p, bufs in cases:
        assert set(p) == set(k.params) and len(bufs) == len(k.buffers), name
    return cases
