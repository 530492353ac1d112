"""Dependency inference on hand-made graphs: the rules of a sequential-task-flow runtime."""

import numpy as np

from tilecast.graph import GraphBuilder, Tiling
from tilecast.kernels import R, RW, W


def _graph(accesses, n_tiles=3):
    """accesses: per task a list of (tile, mode); tasks use the generic 'fill' (W) / 'axpy' kernels."""
    b = GraphBuilder(Tiling())
    t = b.tensor("t", (n_tiles,), ("embd",), "activation", tiles={"embd": 1})
    for acc in accesses:
        if len(acc) == 1:
            (tile, mode), = acc
            b.add("fill", [t.first_tile + tile], dict(n=1, value=0.0), modes=[mode])
        else:
            (t0, m0), (t1, m1) = acc
            b.add("axpy", [t.first_tile + t0, t.first_tile + t1], dict(n=1, alpha=1.0), modes=[m0, m1])
    g = b.build()
    return [sorted(g.predecessors(i).tolist()) for i in range(g.n_tasks)]


def test_read_after_write():
    assert _graph([[(0, W)], [(0, R), (1, W)]]) == [[], [0]]


def test_write_after_read_waits_for_every_reader():
    deps = _graph([[(0, W)], [(0, R), (1, W)], [(0, R), (2, W)], [(0, W)]])
    assert deps[3] == [1, 2]


def test_write_after_write():
    assert _graph([[(0, W)], [(0, W)], [(0, RW)]]) == [[], [0], [1]]


def test_independent_readers_do_not_depend_on_each_other():
    deps = _graph([[(0, W)], [(0, R), (1, W)], [(0, R), (2, W)]])
    assert deps == [[], [0], [0]]


def test_untouched_tiles_create_no_dependency():
    assert _graph([[(0, W)], [(1, W)], [(2, W)]]) == [[], [], []]


def test_chain_of_read_writes():
    deps = _graph([[(0, W)], [(1, R), (0, RW)], [(1, R), (0, RW)]])
    assert deps == [[], [0], [1]]


def test_gpt2_dependencies_point_backwards():
    from tilecast.graph.gpt2 import build_gpt2_step
    from tilecast.graph.model_config import load_model

    g = build_gpt2_step(load_model("gpt2-tiny"), 2, 8, Tiling.parse("4"))
    ptr, pred = g.dependencies
    dst = np.repeat(np.arange(g.n_tasks), np.diff(ptr))
    assert len(pred) > g.n_tasks
    assert (pred < dst).all()


def _reference(acc_ptr, acc_tile, acc_mode):
    """The runtime's rules access by access, in submission order: last writer and readers since, per tile."""
    last_w, readers, out = {}, {}, []
    for i in range(len(acc_ptr) - 1):
        preds = set()
        for tile, mode in zip(acc_tile[acc_ptr[i]:acc_ptr[i + 1]].tolist(), acc_mode[acc_ptr[i]:acc_ptr[i + 1]].tolist()):
            if mode & 2:
                preds |= readers.get(tile) or ({last_w[tile]} if tile in last_w else set())
                last_w[tile], readers[tile] = i, set()
            else:
                preds |= {last_w[tile]} if tile in last_w else set()
                readers.setdefault(tile, set()).add(i)
        out.append(sorted(preds - {i}))
    return out


def test_random_accesses_over_tile_ids_beyond_32_bits_of_sort_key_halves():
    """Tile ids above 2**16 and 2**24 (the vectorised inference sorts one 64-bit key per access and per edge)."""
    from tilecast.graph.deps import infer_dependencies

    rng = np.random.default_rng(7)
    n_tasks = 400
    counts = rng.integers(1, 5, n_tasks)
    acc_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    pool = np.array([0, 5, 70_000, 70_001, 2**24 + 3, 2**31 - 2], dtype=np.int32)
    acc_tile = pool[rng.integers(0, len(pool), acc_ptr[-1])]
    acc_mode = rng.choice(np.array([R, W, RW], dtype=np.int8), acc_ptr[-1])
    ptr, pred = infer_dependencies(acc_ptr, acc_tile, acc_mode)
    assert ptr.dtype == np.int64 and pred.dtype == np.int32
    got = [pred[ptr[i]:ptr[i + 1]].tolist() for i in range(n_tasks)]
    assert got == _reference(acc_ptr, acc_tile, acc_mode)
