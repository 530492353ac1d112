"""A StarPU-MPI rank keeps only its own tiles (and the batch's), so its memory shrinks with the ranks."""

import numpy as np

from tilecast.executor.mpi_rank import own_tiles
from tilecast.reference.step import TrainState, init_params, load_step
from tilecast.graph import Tiling
from tilecast.graph.distribution import prepare
from tilecast.graph.model_config import load_model
from tilecast.graph.models import build_step


def test_rank_keeps_its_own_tiles():
    cfg = load_model("gpt2-tiny")
    graph, dist = prepare(build_step(cfg, 4, 32, Tiling.parse("32,batch=1")), 2, "data")
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (4, 33))
    kept = []
    for me in (0, 1):
        store = load_step(graph, TrainState(init_params(cfg, 0)), ids[:, :-1], ids[:, 1:])
        ptrs, nelem, itemsize = own_tiles(graph, store, dist.owner, me)
        mine = dist.owner == me
        inputs = np.array([t.kind == "input" for t in graph.tensors])[graph.tile_tensor]
        held = np.array([b is not None for b in store.buffers])
        assert np.array_equal(held, mine | inputs)
        assert (ptrs[mine] != 0).all() and (ptrs[~mine] == 0).all()
        assert np.array_equal(nelem * itemsize, graph.tile_nbytes)
        kept.append(sum(b.nbytes for b in store.buffers if b is not None))
    assert max(kept) < 0.75 * int(graph.tile_nbytes.sum())
