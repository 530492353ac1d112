"""The output rule shared by the product kernels: out = alpha * prod + beta * out."""


def blend(out, prod, alpha: float, beta: float) -> None:
    """Write ``alpha * prod + beta * out`` into ``out`` in place (beta 0 ignores out's old contents)."""
    if alpha != 1.0:
        prod *= out.dtype.type(alpha)
    if beta == 0.0:
        out[...] = prod
        return
    if beta != 1.0:
        out *= out.dtype.type(beta)
    out += prod
