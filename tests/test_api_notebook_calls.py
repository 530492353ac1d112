"""The calls the example notebooks use (tc.gantt, tc.kernel_times, tc.memory, tc.recalibrate, tc.load_cluster)
give the figures of the library functions they wrap; a bad argument raises an error naming it."""

import math

import pytest
from matplotlib.figure import Figure

import tilecast as tc
from tilecast.api.base import _config, _tiling
from tilecast.executor.memory_limit import minimum_bytes
from tilecast.graph.analysis import live_memory
from tilecast.graph.models import build_step

from loop_home import loop_home, loop_home_dir  # noqa: F401

TINY = dict(model="gpt2-tiny", batch=2, seq=32, tile="32")
H100 = "h100-sxm5-80gb-8"


def test_memory_equals_live_memory_and_minimum_bytes():
    m = tc.memory(**TINY, recompute="selective", workers=2)
    g = build_step(_config("gpt2-tiny"), 2, 32, _tiling("32"), recompute="selective")
    live = live_memory(g)
    assert (m.peak_bytes, m.persistent_bytes, m.activation_peak_bytes, m.peak_tag) == \
        (live["peak_bytes"], live["persistent_bytes"], live["activation_peak_bytes"], live["peak_tag"])
    assert m.working_set_bytes == minimum_bytes([g], 2, offload=True) > 0
    assert m.params == tc.model("gpt2-tiny").params and m.tasks == g.n_tasks
    doc = tc.graph(**TINY, recompute="selective").summary  # what `graph --json` prints
    assert (doc["live_bytes"], doc["live_persistent_bytes"]) == (m.peak_bytes, m.persistent_bytes)
    curve = m.to_frame()
    assert len(curve) == g.n_tasks and curve["live_bytes"].max() == m.peak_bytes
    assert curve["live_bytes"].min() >= m.persistent_bytes
    assert curve.loc[live["peak_task"], "tag"] == m.peak_tag
    assert "working set" in m._repr_html_()
    with pytest.raises(ValueError, match="^workers must be"):
        tc.memory(**TINY, workers=0)


def test_gantt_and_kernel_times_of_a_prediction():
    s = tc.simulate(**TINY, machine=H100, sched="eager", workers=2)
    per = tc.kernel_times(s)
    tasks = s.trace()
    tasks = tasks[tasks["task"] >= 0]
    assert per["tasks"].sum() == s.tasks and set(per.index) == set(tc.graph(**TINY).kernels)
    assert per["busy_s"].sum() == pytest.approx((tasks["end_s"] - tasks["start_s"]).sum())
    assert per["share"].sum() == pytest.approx(1.0) and list(per["busy_s"]) == sorted(per["busy_s"], reverse=True)
    fig = tc.gantt(s, title="t")
    assert isinstance(fig, Figure) and fig.axes
    both = tc.gantt(s, real=s.trace())
    assert isinstance(both, Figure) and "measured" in both.axes[0].get_title(loc="left")
    with pytest.raises(ValueError, match="^real must be"):
        tc.gantt(s, real="nothing")


def test_recalibrate_equals_calibration_from_trace(loop_home, tmp_path):  # noqa: F811
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.calibration import Calibration, find_calibration
    from tilecast.perfmodel.from_trace import calibration_from_trace

    r = tc.run(**TINY, sched="eager", workers=1, steps=2)
    learned = tc.recalibrate(r, out=str(tmp_path / "learned.json"))
    m = load_machine("local")
    direct = calibration_from_trace(r.graph, [r.trace], m, base=find_calibration(m))
    saved = Calibration.load(learned.path, m.fingerprint())
    assert saved.points.keys() == direct.points.keys()
    for name, e in direct.points.items():
        assert saved.points[name]["median_s"] == pytest.approx(e["median_s"])
    frame = learned.to_frame()
    assert learned.shapes == len(frame) > 0 and learned.kernels == frame["kernel"].nunique()
    assert set(frame["kernel"]) <= set(tc.graph(**TINY).kernels) and (frame["learned_s"] > 0).all()
    assert learned.new_shapes == frame["before_s"].isna().sum()
    assert learned.median_change is None or math.isfinite(learned.median_change)
    again = tc.simulate(**TINY, sched="eager", workers=1, calibration=learned.path)
    assert again.step_s > 0
    with pytest.raises(ValueError, match="^run must be"):
        tc.recalibrate(tc.simulate(**TINY, machine=H100))


def test_load_cluster_is_the_cluster_the_whatif_calls_take():
    from tilecast.cluster.hardware import Cluster
    from tilecast.cluster.hardware import load_cluster as library_load

    h100 = tc.load_cluster("dgx-h100")
    assert isinstance(h100, Cluster) and h100 == library_load("dgx-h100") and tc.load_cluster(h100) is h100
    faster = h100.scaled(network_bandwidth=2)
    assert faster.inter_node.bandwidth == 2 * h100.inter_node.bandwidth
    layout = dict(gpus=64, seq=2048, global_batch=64, tp=8, pp=1)
    assert tc.whatif("llama2-7b", cluster=h100, **layout).step_s == tc.whatif("llama2-7b", cluster="dgx-h100",
                                                                            **layout).step_s
    with pytest.raises(ValueError, match="^cluster: 'nosuch' is neither"):
        tc.load_cluster("nosuch")
