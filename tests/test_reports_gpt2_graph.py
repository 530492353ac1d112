"""A comparison on the schedule of a real GPT-2 step graph (gpt2-tiny), with one kernel mispredicted."""

import json

import numpy as np
import pytest

from synthetic_traces import graph_schedule
from tilecast.graph.gpt2 import build_gpt2_step
from tilecast.graph.model_config import load_model
from tilecast.graph.tiling import Tiling
from tilecast.kernels import all_kernels
from tilecast.reports import compare


@pytest.fixture(scope="module")
def graph():
    return build_gpt2_step(load_model("gpt2-tiny"), 2, 32, Tiling.parse("16"))


def test_gemm_measured_25_percent_slower(graph, tmp_path):
    durations = 1e-6 + graph.flops / 1e9
    kernel = np.array([k.name for k in all_kernels()])[graph.kernel]
    is_gemm = kernel == "gemm"
    pred = graph_schedule(graph, durations, 2, "sim")
    real = graph_schedule(graph, np.where(is_gemm, 1.25, 1.0) * durations, 2, "real")
    c = compare(pred, real, graph=graph)

    k = c.by_kernel.set_index("kernel")
    assert k.loc["gemm", "median_error"] == pytest.approx(-0.2, rel=1e-9)
    assert k.loc["gemm", "p90_abs_error"] == pytest.approx(0.2, rel=1e-9)
    # other kernels: exact but for rounding (durations are differences of shifted start and end times)
    assert np.abs(k.drop(index="gemm")["median_error"]).max() < 1e-9
    assert c.by_kernel["kernel"].iloc[0] == "gemm"
    assert c.real_makespan_s > c.pred_makespan_s
    m = c.summary()["makespan"]
    assert m["from_task_time_s"] + m["from_idle_time_s"] == pytest.approx(m["diff_s"], rel=1e-9)
    assert m["from_task_time_s"] == pytest.approx(-0.25 * durations[is_gemm].sum() / 2, rel=1e-9)

    # phase ranking: layer numbers merged, so h*.mlp.bwd gathers both layers' MLP backward gemms
    tags = np.array(graph.tags, dtype=object)[graph.tag]
    phases = np.array([t.replace("h0", "h*").replace("h1", "h*") for t in tags])
    diff = {p: -0.25 * durations[is_gemm & (phases == p)].sum() for p in set(phases[is_gemm])}
    expected = sorted(diff, key=lambda p: -abs(diff[p]))
    assert list(c.by_phase["phase"][:len(expected)]) == expected
    assert c.by_phase["share"].sum() == pytest.approx(1.0)

    paths = c.write(str(tmp_path))
    with open(paths["real_chrome_json"]) as f:
        events = json.load(f)["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) == graph.n_tasks
    assert sum(e["ph"] == "s" for e in events) == len(graph.dependencies[1])
