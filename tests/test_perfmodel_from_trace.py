"""Kernel models learned from a measured trace."""

import numpy as np
import pytest
from sim_graphs import gemm_chain_graph

from tilecast.kernels import get
from tilecast.perfmodel import load_machine
from tilecast.perfmodel.from_trace import calibration_from_trace
from tilecast.perfmodel.kernel_model import DurationModel
from tilecast.trace import make_trace


def _trace(graph, seconds):
    n = graph.n_tasks
    start = np.cumsum(np.concatenate(([0.0], seconds[:-1])))
    return make_trace(task=np.arange(n), kernel="gemm", worker=0, node=0, start_s=start, end_s=start + seconds,
                      bytes=0, flops=0.0, source="real", tag="")


def test_medians_per_shape_become_measured_points():
    g = gemm_chain_graph(n_layers=2, tiles=2, tile=32)  # two shapes: beta 0 (first write) and beta 1
    beta = g.params[g.param_ptr[:-1] + get("gemm").params.index("beta")]
    rng = np.random.default_rng(0)
    seconds = np.where(beta == 0, 2e-5, 5e-5) * rng.uniform(0.9, 1.1, g.n_tasks)
    seconds[0] = 1.0  # one outlier does not move a median
    m = load_machine("local")
    cal = calibration_from_trace(g, _trace(g, seconds), m)
    assert cal.timer == "trace" and cal.fingerprint == m.fingerprint()
    med = dict(zip([s[6] for s in cal.points["gemm"]["shapes"]], cal.points["gemm"]["median_s"]))
    assert med[0.0] == pytest.approx(np.median(seconds[beta == 0]))
    assert med[1.0] == pytest.approx(np.median(seconds[beta == 1]))
    d = DurationModel(m, cal).durations(g)
    np.testing.assert_allclose(d[0], np.where(beta == 0, med[0.0], med[1.0]))


def test_a_trace_without_measured_tasks_is_refused():
    g = gemm_chain_graph(n_layers=1, tiles=1, tile=16)
    t = _trace(g, np.ones(g.n_tasks)).assign(source="sim")
    with pytest.raises(ValueError, match="no measured task rows"):
        calibration_from_trace(g, t, load_machine("local"))
