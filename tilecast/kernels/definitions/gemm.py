"""General matrix multiply on tiles viewed as matrices."""

from tilecast.kernels.definitions.blend import blend
from tilecast.kernels.registry import kernel


def _flops(p):
    return 2.0 * p["m"] * p["n"] * p["k"]


@kernel("gemm", "a:R b:R c:RW", "trans_a trans_b m n k alpha beta", _flops)
def gemm(xp, bufs, p):
    """C (m x n) = alpha * op(A) @ op(B) + beta * C; op(A) is m x k, op(B) is k x n.

    A is stored k x m when trans_a, B is stored n x k when trans_b (row major).
    """
    a, b, c = bufs
    m, n, k = int(p.m), int(p.n), int(p.k)
    am = a.reshape((k, m)).T if p.trans_a else a.reshape((m, k))
    bm = b.reshape((n, k)).T if p.trans_b else b.reshape((k, n))
    cm = c.reshape((m, n))
    blend(cm, am @ bm, p.alpha, p.beta)
