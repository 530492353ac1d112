"""Every C kernel computes what its numpy reference computes, on full and uneven tiles."""

import zlib

import numpy as np
import pytest

from tilecast.kernels import all_kernels
from tilecast.kernels.native import kernel_functions, run_kernel, time_kernel
from tilecast.kernels.samples import EVEN, UNEVEN, sample_tasks

NAMES = [k.name for k in all_kernels()]


def _close(name, got, want, tol=2e-5):
    """max|a-b| <= tol * max(1, max|b|) over finite entries; infinities and NaNs must coincide."""
    assert got.shape == want.shape
    fin = np.isfinite(want)
    assert np.array_equal(fin, np.isfinite(got)), f"{name}: non-finite entries differ"
    assert np.array_equal(got[~fin], want[~fin], equal_nan=True), f"{name}: infinities differ"
    if fin.any():
        scale = max(1.0, float(np.abs(want[fin]).max()))
        err = float(np.abs(got[fin].astype(np.float64) - want[fin]).max())
        assert err <= tol * scale, f"{name}: max |c - numpy| = {err:.3g} (scale {scale:.3g})"


def test_every_registry_kernel_has_a_c_function():
    assert len(kernel_functions()) == len(NAMES)


@pytest.mark.parametrize("dims", [EVEN, UNEVEN], ids=["even", "uneven"])
@pytest.mark.parametrize("name", NAMES)
def test_c_kernel_matches_numpy_reference(name, dims):
    k = next(k for k in all_kernels() if k.name == name)
    # a seed of the case's name: the same cases in every process (hash() of a str changes per process)
    cases = sample_tasks(name, np.random.default_rng(zlib.crc32(f"{name}/{dims['n']}".encode())), dims)
    assert cases
    for params, bufs in cases:
        want = [b.copy() for b in bufs]
        k.reference(np, want, k.unpack([params[p] for p in k.params]))
        got = [b.copy() for b in bufs]
        run_kernel(name, params, got)
        for j, (g, w) in enumerate(zip(got, want)):
            _close(f"{name} {params} buffer {k.buffers[j]}", g, w)


def test_time_kernel_returns_positive_durations():
    params, bufs = sample_tasks("gemm", np.random.default_rng(0))[0]
    t = time_kernel("gemm", params, bufs, repeats=5)
    assert t.shape == (5,) and (t > 0).all()


def test_bad_buffers_are_refused():
    params, bufs = sample_tasks("axpy", np.random.default_rng(0))[0]
    with pytest.raises(ValueError, match="2 buffers expected"):
        run_kernel("axpy", params, bufs[:1])
    with pytest.raises(ValueError, match="float32"):
        run_kernel("axpy", params, [bufs[0].astype(np.float64), bufs[1]])


def test_vectorised_exp_and_tanh_over_their_whole_range():
    """softmax_apply with m=0, l=1 is exp(x); gelu goes through tanh: edge values included."""
    x = np.concatenate([np.linspace(-110, 95, 20001), [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-30, -1e-30]])
    x = x.astype(np.float32)
    rows = len(x)
    got = x.copy()
    run_kernel("softmax_apply", dict(rows=rows, cols=1), [np.tile(np.float32([0, 1]), rows), got])
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64))
    normal = want >= np.finfo(np.float32).tiny
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert (got[~normal & ~np.isnan(want)] <= np.finfo(np.float32).tiny).all()  # subnormal results flush to 0
    fin = normal & np.isfinite(want) & (want < np.finfo(np.float32).max)
    assert np.abs(got[fin] / want[fin] - 1).max() < 3e-7
    assert (got[want > np.finfo(np.float32).max] == np.inf).all()
    y = np.empty_like(x)
    run_kernel("gelu", dict(n=rows), [x, y])
    xd = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        want = 0.5 * xd * (1 + np.tanh(np.sqrt(2 / np.pi) * (xd + 0.044715 * xd ** 3)))
    ok = np.isfinite(want)
    assert np.array_equal(y[~ok], want[~ok].astype(np.float32), equal_nan=True)
    assert (np.abs(y[ok] - want[ok]) <= 2e-6 * np.abs(want[ok]) + 1e-6).all()


@pytest.mark.parametrize("q0,k0,causal", [(0, 0, 1), (0, 2, 1), (40, 0, 1), (0, 0, 0)],
                         ids=["diagonal", "masked-rows", "below-diagonal", "full"])
def test_fused_scores_softmax_gives_the_same_bits_as_the_three_kernels(q0, k0, causal):
    """attn_qk_softmax = attn_qk, softmax_stats (beta 0), softmax_apply, bit for bit (rows of 37: 2 lanes + a tail)."""
    rng = np.random.default_rng(7)
    bt, ht, sq, sk, d = 2, 3, 21, 37, 8
    q, k = (rng.standard_normal(bt * s * ht * d).astype(np.float32) * 2 for s in (sq, sk))
    p = dict(bt=bt, ht=ht, sq=sq, sk=sk, d=d, alpha=0.35, q0=q0, k0=k0, causal=causal)
    s_want, st_want = np.zeros(bt * ht * sq * sk, np.float32), np.full(bt * ht * sq * 2, 9, np.float32)
    run_kernel("attn_qk", p, [q, k, s_want])
    run_kernel("softmax_stats", dict(rows=bt * ht * sq, cols=sk, beta=0.0), [s_want, st_want])
    run_kernel("softmax_apply", dict(rows=bt * ht * sq, cols=sk), [st_want, s_want])
    s_got, st_got = np.zeros_like(s_want), np.full_like(st_want, 9)
    run_kernel("attn_qk_softmax", p, [q, k, s_got, st_got])
    assert np.array_equal(s_got, s_want, equal_nan=True)
    assert np.array_equal(st_got, st_want, equal_nan=True)


@pytest.mark.parametrize("name", ["attn_qk", "attn_pv", "attn_ptv"])
@pytest.mark.parametrize("q0,k0,causal", [(0, 0, 1), (70, 0, 1), (0, 30, 1), (5, 3, 1), (0, 0, 0)],
                         ids=["diagonal", "below-diagonal", "masked-rows", "offset", "full"])
def test_causal_products_over_several_blocks(name, q0, k0, causal):
    """Tiles larger than the C kernels' blocks of masked entries (several row and column blocks, uneven
    ends): the same results as the references; masked probabilities hold NaN, which must count as zero."""
    rng = np.random.default_rng(11)
    bt, ht, sq, sk, d = 1, 2, 150, 170, 8
    k = next(k for k in all_kernels() if k.name == name)
    tok = lambda s: rng.standard_normal(bt * s * ht * d).astype(np.float32)  # noqa: E731
    p = dict(bt=bt, ht=ht, sq=sq, sk=sk, d=d, alpha=0.5, q0=q0, k0=k0, causal=causal)
    if name == "attn_qk":
        bufs = [tok(sq), tok(sk), np.full(bt * ht * sq * sk, 7, np.float32)]
    else:
        pr = rng.random((bt, ht, sq, sk)).astype(np.float32)
        if causal:
            pr[..., (np.arange(sk)[None, :] + k0) > (np.arange(sq)[:, None] + q0)] = np.nan
        p["beta"] = 1.0
        bufs = [pr.ravel(), tok(sk), tok(sq)] if name == "attn_pv" else [pr.ravel(), tok(sq), tok(sk)]
    want = [b.copy() for b in bufs]
    k.reference(np, want, k.unpack([p[n] for n in k.params]))
    got = [b.copy() for b in bufs]
    run_kernel(name, p, got)
    _close(f"{name} {p}", got[-1], want[-1])
