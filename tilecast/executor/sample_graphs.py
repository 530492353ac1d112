"""Small hand-built graphs for testing and benchmarking executors (no model builder needed)."""

from __future__ import annotations

import numpy as np

from tilecast.graph import Graph, GraphBuilder, Tiling


def tiled_matmul_gelu(m: int, k: int, n: int, tile: int) -> Graph:
    """Y = gelu(A @ B) with A (m x k, input), B (k x n, param), every dimension tiled by ``tile``.

    Each output tile accumulates over the k tiles (first product overwrites,
    later ones add), then one GELU per tile: reads after writes, writes after
    writes and writes after reads all occur.
    """
    b = GraphBuilder(Tiling.uniform(tile), meta={"name": "tiled_matmul_gelu"})
    A = b.tensor("a", (m, k), ("seq", "embd"), "input")
    B = b.tensor("b", (k, n), ("embd", "inner"), "param")
    C = b.tensor("c", (m, n), ("seq", "inner"), "activation")
    Y = b.tensor("y", (m, n), ("seq", "inner"), "activation")
    i, j = (x.ravel() for x in np.meshgrid(np.arange(A.grid[0]), np.arange(B.grid[1]), indexing="ij"))
    with b.tagged("matmul"):
        for l in range(A.grid[1]):
            ct = C.tile_ids(i, j)
            beta, mode = b.accumulate(ct)
            b.add("gemm", [A.tile_ids(i, l), B.tile_ids(l, j), ct],
                  dict(trans_a=0, trans_b=0, m=A.extent(0, i), n=B.extent(1, j), k=A.extent(1, l), alpha=1.0,
                       beta=beta), modes=[None, None, mode])
    with b.tagged("gelu"):
        b.add("gelu", [C.tile_ids(i, j), Y.tile_ids(i, j)], dict(n=C.extent(0, i) * C.extent(1, j)))
    return b.build()


def reference_matmul_gelu(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    c = a.astype(np.float64) @ b.astype(np.float64)
    return 0.5 * c * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (c + 0.044715 * c ** 3)))
