"""Memory per GPU against hand-computed values."""

import pytest

from tilecast.cluster.hardware import load_cluster
from tilecast.cluster.memory import (activation_bytes_per_layer, memory_per_gpu, model_state_bytes,
                                     stage_params)
from tilecast.graph.model_config import load_model
from tilecast.cluster.strategy import Strategy


@pytest.mark.parametrize("zero, want", [(0, (2e9, 2e9, 12e9)), (1, (2e9, 2e9, 1.5e9)),
                                        (2, (2e9, 0.25e9, 1.5e9)), (3, (0.25e9, 0.25e9, 1.5e9))])
def test_zero_stages_one_billion_params_eight_ranks(zero, want):
    # Rajbhandari et al. 2020: 2 + 2 + 12 bytes per parameter, partitioned stage by stage.
    assert model_state_bytes(1e9, zero, 8) == pytest.approx(want)


def test_zero_totals_for_gpt2_xl():
    shape = load_model("gpt2-xl")
    n = shape.n_params()  # tp = pp = 1: the rank holds the whole model
    st = Strategy(dp=16, seq=1024, global_batch=16)
    assert stage_params(shape, st) == n
    totals = {}
    for z in range(4):
        m = memory_per_gpu(shape, st.with_(zero=z))
        totals[z] = m.params + m.grads + m.optimizer
    assert totals[0] == pytest.approx(16 * n)
    assert totals[1] == pytest.approx(4 * n + 12 * n / 16)
    assert totals[2] == pytest.approx(2 * n + 14 * n / 16)
    assert totals[3] == pytest.approx(16 * n / 16)


def test_activations_match_korthikanti_formula():
    shape = load_model("gpt3-175b")
    s, b, h, a = 2048, 1, 12288, 96
    st = Strategy(tp=8, seq=s, global_batch=8, micro_batch=b, attention="unfused")
    t = 8
    assert activation_bytes_per_layer(shape, st) == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))
    sp = st.with_(sequence_parallel=True, recompute="selective")
    assert activation_bytes_per_layer(shape, sp) == pytest.approx(s * b * h * 34 / t)
    full = st.with_(recompute="full")
    assert activation_bytes_per_layer(shape, full) == pytest.approx(2 * s * b * h)


def test_pipeline_in_flight_and_fit_flag():
    c = load_cluster("dgx-a100")
    shape = load_model("gpt3-175b")
    st = Strategy(tp=8, pp=8, dp=1, seq=2048, global_batch=64, recompute="selective", sequence_parallel=True)
    one_f = memory_per_gpu(shape, st, c)
    gpipe = memory_per_gpu(shape, st.with_(schedule="gpipe"), c)
    assert gpipe.activations == pytest.approx(one_f.activations * 64 / 8)  # m vs p micro-batches in flight
    # 175B on a single 8-GPU node cannot hold its optimizer states: flagged, not hidden
    too_big = memory_per_gpu(shape, Strategy(tp=8, pp=1, dp=1, seq=2048, global_batch=8), c)
    assert too_big.total > c.gpu.memory_bytes


def test_every_published_run_is_predicted_to_fit():
    """The validation runs really trained: the memory model must not call any of them too big."""
    from tilecast.cluster.validation import load_runs

    for r in load_runs():
        m = memory_per_gpu(load_model(r.model), r.strategy, load_cluster(r.cluster))
        assert m.total <= load_cluster(r.cluster).gpu.memory_bytes, (r.id, m.total / 1e9)
