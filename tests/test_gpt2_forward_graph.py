"""The forward-only GPT-2 graph (evaluation) gives the loss the training step computes before its update."""

import numpy as np

from tilecast.reference.run import run_reference
from tilecast.reference.step import TrainState, init_gpt2_params, reference_step
from tilecast.reference.tiles import TileStore
from tilecast.graph import Tiling
from tilecast.graph.gpt2 import build_gpt2_forward, build_gpt2_step, gpt2_parameters
from tilecast.graph.model_config import load_model


def test_forward_graph_loss_equals_step_loss_and_shares_parameter_tiles():
    cfg, tiling = load_model("gpt2-tiny"), Tiling.parse("16,seq=8")
    fwd, step = build_gpt2_forward(cfg, 2, 24, tiling), build_gpt2_step(cfg, 2, 24, tiling)
    assert fwd.n_tasks < step.n_tasks / 2
    assert not any(t.name.startswith(("grad:", "adam_")) for t in fwd.tensors)
    for name in gpt2_parameters(cfg):
        assert np.array_equal(fwd.tensor(name).tile_shapes(), step.tensor(name).tile_shapes())

    state = TrainState(init_gpt2_params(cfg, seed=3))
    data = np.random.default_rng(3).integers(0, 256, size=(2, 25))
    store = TileStore(fwd)
    for name, p in state.params.items():
        store.set_tensor(name, p)
    store.set_tensor("ids", data[:, :-1])
    store.set_tensor("targets", data[:, 1:])
    run_reference(fwd, store)
    want = reference_step(step, state, data[:, :-1], data[:, 1:], want_grads=False).loss
    assert float(store.tensor("loss")[0]) == want
