import numpy as np

from tilecast.graph import GraphBuilder, Tiling
from tilecast.graph.analysis import critical_path, live_bytes, summary
from tilecast.graph.gpt2 import build_gpt2_step
from tilecast.graph.model_config import load_model


def test_critical_path_of_fork_join():
    b = GraphBuilder(Tiling())
    t = b.tensor("t", (4, 8), ("embd", None), "activation", tiles={"embd": 1})
    ids = t.first_tile + np.arange(4)
    b.add("fill", [ids[0]], dict(n=8, value=1.0))                       # source
    b.add("axpy", [ids[0], ids[1]], dict(n=8, alpha=1.0), modes=[None, 2])  # 16 flops each
    b.add("axpy", [ids[0], ids[2]], dict(n=8, alpha=1.0), modes=[None, 2])
    b.add("axpy", [ids[1], ids[2]], dict(n=8, alpha=1.0))                # join
    g = b.build()
    assert critical_path(g) == 16 * 2
    assert critical_path(g, weights=np.ones(4)) == 3


def test_live_bytes_counts_overlapping_lifetimes_only():
    b = GraphBuilder(Tiling())
    t = b.tensor("t", (3, 100), ("embd", None), "activation", tiles={"embd": 1})
    ids = t.first_tile + np.arange(3)
    b.add("fill", [ids[0]], dict(n=100, value=1.0))
    b.add("axpy", [ids[0], ids[1]], dict(n=100, alpha=1.0), modes=[None, 2])  # last use of tile 0
    b.add("axpy", [ids[1], ids[2]], dict(n=100, alpha=1.0), modes=[None, 2])
    g = b.build()
    assert live_bytes(g) == 2 * 400


def test_gpt2_flops_close_to_analytic_count():
    # Training flops ~ 6 * params * tokens plus attention (Kaplan et al. 2020, section 2.1);
    # the tiled graph also counts element-wise work and the optimizer, so allow a few percent.
    cfg = load_model('{"n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 512, "n_positions": 64}')
    B, S = 2, 64
    g = build_gpt2_step(cfg, B, S, Tiling())
    n_nonembed = cfg.n_layer * 12 * cfg.n_embd ** 2
    dense = 6 * (n_nonembed + cfg.vocab_size * cfg.n_embd) * B * S
    attention = 3 * 2 * 2 * cfg.n_layer * B * S * S * cfg.n_embd  # QK^T and PV, forward + 2x backward
    s = summary(g)
    assert 0.98 < s["flops"] / (dense + attention) < 1.10
    assert s["critical_path_flops"] <= s["flops"]


def test_finer_tiling_means_more_tasks_and_same_flops_without_attention_waste():
    cfg = load_model("gpt2-tiny")
    coarse = build_gpt2_step(cfg, 2, 16, Tiling())
    fine = build_gpt2_step(cfg, 2, 16, Tiling.parse("embd=16,inner=32,vocab=64"))
    assert fine.n_tasks > coarse.n_tasks
    assert np.isclose(fine.flops.sum(), coarse.flops.sum(), rtol=1e-9)


def test_a_given_sweep_gives_the_same_critical_path_and_kernel_params_follow_task_order():
    import pytest

    from tilecast.simulator import native

    g = build_gpt2_step(load_model("gpt2-tiny"), 2, 64, Tiling.parse("16"))
    if native.library() is None:
        pytest.skip("the simulator's C extension cannot be built here")
    done = []
    assert critical_path(g, sweep=native.longest_path_end, progress=done.append) == critical_path(g)
    assert done == [g.n_tasks]
    assert critical_path(g, sweep=lambda *a: None) == critical_path(g)  # None: the Python sweep
    for kid in np.unique(g.kernel):
        ids, p = g.kernel_params(int(kid))
        assert np.array_equal(ids, np.flatnonzero(g.kernel == kid))
        assert np.array_equal(p[:, 0], g.params[g.param_ptr[ids]])
