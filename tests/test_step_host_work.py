"""What a training loop does between steps: the batch is written in place, so no tile is registered again."""

import numpy as np

from tilecast.executor.starpu_run import StarPUTraining, run_steps
from tilecast.executor.starpu_session import StarPUSession
from tilecast.reference.step import TrainState, init_gpt2_params
from tilecast.reference.tiles import TileStore
from tilecast.graph import Tiling
from tilecast.graph.gpt2 import build_gpt2_step
from tilecast.graph.model_config import load_model


def test_write_tensor_keeps_buffers_and_splits_like_set_tensor():
    g = build_gpt2_step(load_model("gpt2-tiny"), 4, 16, Tiling.parse("batch=3,seq=5"))  # uneven tiles
    a, b = TileStore(g), TileStore(g)
    ids = np.random.default_rng(0).integers(0, 256, size=(4, 16))
    a.write_tensor("ids", ids)  # nothing allocated yet: splits
    t = g.tensor("ids")
    before = a.buffers[t.first_tile:t.first_tile + t.n_tiles]
    ids2 = ids[::-1].copy()
    a.write_tensor("ids", ids2)
    b.set_tensor("ids", ids2)
    after = a.buffers[t.first_tile:t.first_tile + t.n_tiles]
    assert all(x is y for x, y in zip(before, after))
    assert all(np.array_equal(x, y) for x, y in zip(after, b.buffers[t.first_tile:t.first_tile + t.n_tiles]))
    np.testing.assert_array_equal(a.tensor("ids"), ids2)


def test_tiles_set_from_one_array_do_not_share_memory():
    # seq untiled: each tile is a contiguous run of the array, which a split could return as a view
    g = build_gpt2_step(load_model("gpt2-tiny"), 4, 16, Tiling.parse("batch=2"))
    store, zeros = TileStore(g), np.zeros((4, 16), dtype=np.int64)
    store.set_tensor("ids", zeros)
    store.set_tensor("targets", zeros)  # as a loop's first, empty batch
    ids = np.arange(64).reshape(4, 16)
    store.write_tensor("ids", ids)
    store.write_tensor("targets", ids + 1)
    np.testing.assert_array_equal(store.tensor("ids"), ids)
    np.testing.assert_array_equal(store.tensor("targets"), ids + 1)
    assert not zeros.any()


def test_steps_after_the_first_register_no_tile():
    cfg = load_model("gpt2-tiny")
    g = build_gpt2_step(cfg, 2, 16, Tiling.parse("16"))
    data = np.random.default_rng(1).integers(0, cfg.vocab_size, size=(3, 2, 17))
    with StarPUSession("eager", 2) as s:
        tr = StarPUTraining(s, g, TrainState(init_gpt2_params(cfg, 0)), data)
        tr.step(trace=False)
        assert s.tile_handles.last_registered == g.n_tiles
        for _ in range(2):
            tr.step(trace=False)
            assert s.tile_handles.last_registered == 0
        np.testing.assert_array_equal(tr.store.tensor("ids"), data[2, :, :-1])


def test_host_time_is_reported_and_small_beside_the_step():
    r = run_steps(load_model("gpt2-tiny"), 4, 32, Tiling.parse("32"), "eager", 2, 6)
    host = np.subtract(r.step_s[1:], r.makespan_s[1:])
    assert (host >= 0).all() and r.host_s == float(np.median(host))
    assert r.host_s < 0.5 * r.median_step_s  # a loose bound: benchmarks/host_time.py measures the target
