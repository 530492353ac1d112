"""Activation recompute (none, selective, full): same arithmetic, fewer live activations, more tasks."""

import numpy as np
import pytest

from tilecast.reference.step import TrainState, init_params, reference_step
from tilecast.graph import Tiling
from tilecast.graph.analysis import live_memory
from tilecast.graph.model_config import load_model
from tilecast.graph.models import build_step
from tilecast.graph.recompute import PREFIX, RECOMPUTE

# One tiling that divides every dimension, one that divides none (the last tiles are smaller).
TILINGS = {
    "gpt2-tiny": {"even": "8", "uneven": "batch=1,seq=5,embd=24,head=3,inner=100,vocab=60"},
    "llama-tiny": {"even": "8", "uneven": "batch=1,seq=5,embd=24,head=2,inner=100,vocab=60"},
}
CASES = [(m, t) for m, ts in TILINGS.items() for t in ts]


def _step(model, tile, recompute, batch=2, seq=16):
    cfg = load_model(model)
    graph = build_step(cfg, batch, seq, Tiling.parse(tile), recompute=recompute)
    data = np.random.default_rng(1).integers(0, cfg.vocab_size, size=(batch, seq + 1))
    state = TrainState(init_params(cfg, 0))
    res = reference_step(graph, state, data[:, :-1], data[:, 1:])
    return graph, res, state.params


@pytest.mark.parametrize("model,tiling", CASES, ids=[f"{m}-{t}" for m, t in CASES])
def test_reference_step_is_bit_identical_with_recompute(model, tiling):
    """Replayed tasks run the same kernels on the same inputs in the same accumulation order: the loss,
    every gradient and every updated parameter are equal bit for bit, not merely within rounding."""
    tile = TILINGS[model][tiling]
    _, base, base_params = _step(model, tile, "none")
    for setting in ("selective", "full"):
        graph, res, params = _step(model, tile, setting)
        assert graph.meta["recompute"] == setting
        assert res.loss == base.loss, setting
        for name, g in base.grads.items():
            assert np.array_equal(res.grads[name], g), (setting, name)
            assert np.array_equal(params[name], base_params[name]), (setting, name)


def _last_phase(graph, name):
    """The tag of the last task that touches tensor ``name``."""
    t = graph.tensor(name)
    tiles = np.arange(t.first_tile, t.first_tile + t.n_tiles)
    last = graph.access_task[np.isin(graph.acc_tile, tiles)].max()
    return graph.tags[graph.tag[last]]


@pytest.mark.parametrize("model", list(TILINGS))
def test_what_each_setting_keeps(model):
    """selective: the forward's probabilities die in the forward, the backward reads recomputed ones and the
    kept softmax statistics; full: of a layer's activations only its input outlives the forward."""
    cfg = load_model(model)
    graphs = {s: build_step(cfg, 2, 16, Tiling.parse("8"), recompute=s) for s in RECOMPUTE}
    assert _last_phase(graphs["none"], "h.0.attn.probs") == "h0.attn.bwd"
    sel = graphs["selective"]
    assert _last_phase(sel, "h.0.attn.probs") == "h0.attn.fwd"
    assert _last_phase(sel, PREFIX + "h.0.attn.probs") == "h0.attn.bwd"
    assert _last_phase(sel, "h.0.attn.stats") == "h0.attn.fwd"  # softmax statistics are recomputed too
    recomputed = {t.name.removeprefix(PREFIX) for t in sel.tensors if t.name.startswith(PREFIX)}
    assert recomputed == {f"h.{i}.attn.{n}" for i in range(cfg.n_layer) for n in ("probs", "stats")}
    full = graphs["full"]
    layer0 = [t.name for t in full.tensors if t.name.startswith("h.0.") and t.kind == "activation"
              and not any(d in t.name for d in (".d", "sums", "rowdot"))]  # forward activations, not gradients
    assert len(layer0) >= 10
    for name in layer0:
        assert _last_phase(full, name).endswith("fwd"), name
        assert _last_phase(full, PREFIX + name).endswith(("bwd", "recompute")), name
    assert _last_phase(full, "x.0").endswith("bwd")  # the layer's input is kept
    assert "x.1" not in [t.name.removeprefix(PREFIX) for t in full.tensors if t.name.startswith(PREFIX)]


@pytest.mark.parametrize("model", list(TILINGS))
def test_peak_live_memory_falls_and_tasks_rise(model):
    """At 2 x 64 tokens the attention probabilities weigh on the peak: every setting keeps strictly less
    than the one before it and issues strictly more tasks."""
    cfg = load_model(model)
    figures = []
    for setting in RECOMPUTE:
        g = build_step(cfg, 2, 64, Tiling.parse("16"), recompute=setting)
        live = live_memory(g)
        assert live["peak_bytes"] == live["persistent_bytes"] + live["activation_peak_bytes"]
        figures.append((setting, g.n_tasks, live["peak_bytes"], float(g.flops.sum())))
    (_, t0, m0, f0), (_, t1, m1, f1), (_, t2, m2, f2) = figures
    assert m0 > m1 > m2, figures
    assert t0 < t1 < t2, figures
    assert f0 < f1 < f2, figures


def test_live_memory_counts_a_tile_from_first_write_to_last_read():
    from tilecast.graph.builder import GraphBuilder

    b = GraphBuilder(Tiling())
    x = b.tensor("x", (4,), (None,), "param")  # 16 bytes for the whole step
    y = b.tensor("y", (8,), (None,), "activation")  # 32 bytes, alive for tasks 0-1
    z = b.tensor("z", (2,), (None,), "activation")  # 8 bytes, alive for tasks 1-2
    b.add("fill", [y.first_tile], dict(n=8, value=1.0))
    b.add("axpy", [y.first_tile, z.first_tile], dict(n=2, alpha=1.0))
    b.add("axpy", [z.first_tile, x.first_tile], dict(n=2, alpha=1.0))
    live = live_memory(b.build())
    assert live == dict(peak_bytes=16 + 40, persistent_bytes=16, activation_peak_bytes=40, peak_task=1,
                        peak_tag="")


def test_bad_setting_names_the_field():
    with pytest.raises(ValueError, match="^recompute: must be one of none, selective, full"):
        build_step(load_model("gpt2-tiny"), 1, 8, Tiling.parse("8"), recompute="some")
