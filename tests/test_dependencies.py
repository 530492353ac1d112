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
