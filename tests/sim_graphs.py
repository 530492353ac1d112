"""Small task graphs for simulator tests, built with the real GraphBuilder."""

import numpy as np

from tilecast.graph import GraphBuilder, Tiling


def gemm_chain_graph(n_layers: int = 3, tiles: int = 4, tile: int = 64):
    """A tiled matrix chain Y_{l+1} = Y_l @ W_l: each output tile sums over ``tiles`` inputs."""
    b = GraphBuilder(Tiling.uniform(tile))
    n = tiles * tile
    x = b.tensor("x", (n, n), ("seq", "embd"), "input")
    cur = x
    for layer in range(n_layers):
        w = b.tensor(f"w{layer}", (n, n), ("embd", "inner"), "param")
        y = b.tensor(f"y{layer}", (n, n), ("seq", "inner"), "activation")
        i, j, k = np.meshgrid(np.arange(tiles), np.arange(tiles), np.arange(tiles), indexing="ij")
        i, j, k = i.ravel(), j.ravel(), k.ravel()
        beta, mode = b.accumulate(y.tile_ids(i, j))
        with b.tagged(f"layer{layer}"):
            b.add("gemm", [cur.tile_ids(i, k), w.tile_ids(k, j), y.tile_ids(i, j)],
                  dict(trans_a=0, trans_b=0, m=tile, n=tile, k=tile, alpha=1.0, beta=beta),
                  modes=[None, None, mode])
        cur = y
    return b.build()


def random_graph(rng: np.random.Generator, n_tasks: int, n_tiles: int, tile: int = 32):
    """Random axpy/gemm tasks over a pool of square tiles (dependencies inferred as StarPU does)."""
    b = GraphBuilder(Tiling.uniform(tile))
    t = b.tensor("pool", (n_tiles * tile, tile), ("seq", None), "param")
    for _ in range(n_tasks):
        ids = rng.choice(n_tiles, size=3, replace=False)
        if rng.random() < 0.5:
            b.add("gemm", [t.tile_ids(ids[0], 0), t.tile_ids(ids[1], 0), t.tile_ids(ids[2], 0)],
                  dict(trans_a=0, trans_b=0, m=tile, n=tile, k=tile, alpha=1.0, beta=1.0))
        else:
            b.add("axpy", [t.tile_ids(ids[0], 0), t.tile_ids(ids[1], 0)], dict(n=tile * tile, alpha=0.5))
    return b.build()
