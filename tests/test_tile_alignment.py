"""Tile buffers start on a 64-byte boundary, and a StarPU step gives the same results as on misaligned tiles."""

import numpy as np
import pytest

from tilecast.executor.starpu_session import StarPUSession
from tilecast.graph import Tiling
from tilecast.graph.gpt2 import AdamWConfig, build_gpt2_step
from tilecast.graph.model_config import load_model
from tilecast.reference.step import TrainState, finish_step, init_gpt2_params, load_step
from tilecast.reference.tiles import TILE_ALIGN, TileStore, aligned_empty
from tilecast.reference.verify import TOLERANCES, rel_err

BATCH, SEQ = 2, 24
TILE = "seq=16,embd=24,head=2,inner=48,vocab=100"  # uneven tiles: sizes that are not multiples of 64 bytes


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def misaligned_copy(a: np.ndarray, offset: int = 4) -> np.ndarray:
    """A copy of ``a`` whose data starts ``offset`` bytes past a 64-byte boundary."""
    raw = np.empty(a.nbytes + 2 * TILE_ALIGN, np.uint8)
    start = (-address(raw)) % TILE_ALIGN + offset
    out = raw[start:start + a.nbytes].view(a.dtype)
    out[:] = a
    return out


@pytest.mark.parametrize("n, dtype", [(1, np.float32), (17, np.float32), (1000, np.int64), (0, np.float32)])
def test_aligned_empty(n, dtype):
    a = aligned_empty(n, dtype)
    assert a.shape == (n,) and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
    assert n == 0 or address(a) % TILE_ALIGN == 0  # an empty tile is registered with no address


def test_store_allocates_aligned_tiles():
    cfg = load_model("gpt2-tiny")
    graph = build_gpt2_step(cfg, BATCH, SEQ, Tiling.parse(TILE))
    store = load_step(graph, TrainState(init_gpt2_params(cfg, seed=1)),
                      np.zeros((BATCH, SEQ), np.int64), np.ones((BATCH, SEQ), np.int64))
    set_ids = {i for i, b in enumerate(store.buffers) if b is not None}
    assert set_ids, "load_step set no tile"
    store.allocate_all()
    assert [i for i, b in enumerate(store.buffers) if b.nbytes and address(b) % TILE_ALIGN] == []
    # the values set survive: the tiles gather back to what was given
    ids = np.arange(BATCH * SEQ).reshape(BATCH, SEQ) % cfg.vocab_size
    store.set_tensor("ids", ids)
    assert np.array_equal(store.tensor("ids"), ids)


def test_starpu_step_on_aligned_tiles_equals_misaligned():
    cfg = load_model("gpt2-tiny")
    graph = build_gpt2_step(cfg, BATCH, SEQ, Tiling.parse(TILE), AdamWConfig(lr=1e-3, eps=1e-6))
    rng = np.random.default_rng(5)
    data = rng.integers(0, cfg.vocab_size, size=(BATCH, SEQ + 1))
    init = init_gpt2_params(cfg, seed=2)
    results = {}
    with StarPUSession("lws", 2) as session:
        for how in ("aligned", "misaligned"):
            state = TrainState({k: v.copy() for k, v in init.items()})
            store = load_step(graph, state, data[:, :-1], data[:, 1:])
            store.allocate_all()
            if how == "misaligned":
                moved = TileStore(graph)
                moved.buffers = [misaligned_copy(b) for b in store.buffers]
                store = moved
            off = {address(b) % TILE_ALIGN for b in store.buffers if b.nbytes}
            assert off == ({0} if how == "aligned" else {4}), (how, off)
            session.execute(graph, store)
            results[how] = finish_step(graph, store, state)
    got, want = results["aligned"], results["misaligned"]
    assert abs(got.loss - want.loss) <= TOLERANCES["loss"] * abs(want.loss)
    scale = max(float(np.abs(g).max()) for g in want.grads.values())
    for name, g in want.grads.items():
        if float(np.abs(g).max()) < 1e-5 * scale:  # zero in exact arithmetic (attention key bias): noise
            continue
        assert rel_err(got.grads[name], g) <= TOLERANCES["grads"], name
