"""Comparison figures on synthetic traces whose differences are known by construction."""

import json

import numpy as np
import pandas as pd
import pytest

from synthetic_traces import schedule
from tilecast.reports import ComparisonError, compare
from tilecast.reports.worker_usage import busy_time
from tilecast.trace import make_trace

EXACT = dict(rel=1e-12, abs=1e-15)


def by_kernel(c):
    return c.by_kernel.set_index("kernel")


def test_measured_kernel_20_percent_slower():
    # real: every gemm takes 1.2x its predicted time; worker 0 then ends at 5 * (4.8 + 1) = 29 ms.
    c = compare(schedule("sim"), schedule("real", {"gemm": 1.2}))
    k = by_kernel(c)
    assert k.loc["gemm", "median_error"] == pytest.approx((4 - 4.8) / 4.8, **EXACT)
    assert k.loc["gemm", "p90_abs_error"] == pytest.approx((4.8 - 4) / 4.8, **EXACT)
    for other in ("add", "softmax"):
        assert k.loc[other, "median_error"] == 0.0 and k.loc[other, "p90_abs_error"] == 0.0
    assert c.pred_makespan_s == pytest.approx(25e-3, **EXACT)
    assert c.real_makespan_s == pytest.approx(29e-3, **EXACT)
    assert c.makespan_error == pytest.approx((25 - 29) / 29, **EXACT)


def test_predicted_kernel_20_percent_slower_gives_plus_0_2():
    c = compare(schedule("sim", {"softmax": 1.2}), schedule("real"))
    k = by_kernel(c)
    assert k.loc["softmax", "median_error"] == pytest.approx(0.2, **EXACT)
    assert k.loc["softmax", "total_error"] == pytest.approx(0.2, **EXACT)
    assert k.loc["gemm", "median_error"] == 0.0
    assert c.makespan_error == 0.0  # worker 0 (25 ms) still sets the makespan in both


def test_busy_and_idle_per_worker():
    c = compare(schedule("sim"), schedule("real", {"gemm": 1.2})).by_worker.set_index("worker")
    assert c.loc[0, "pred_busy_s"] == pytest.approx(25e-3, **EXACT)
    assert c.loc[0, "real_busy_s"] == pytest.approx(29e-3, **EXACT)
    assert c.loc[0, "real_idle_s"] == pytest.approx(0.0, abs=1e-15)
    assert c.loc[1, "pred_busy_s"] == pytest.approx(5e-3, **EXACT)
    assert c.loc[1, "pred_idle_s"] == pytest.approx(20e-3, **EXACT)
    assert c.loc[1, "real_idle_s"] == pytest.approx(24e-3, **EXACT)
    assert list(c["pred_tasks"]) == [10, 5]


def test_makespan_difference_splits_into_task_and_idle_time():
    # busy: pred 25 + 5, real 29 + 5 -> -4 ms; idle: pred 0 + 20, real 0 + 24 -> -4 ms; over 2 workers.
    m = compare(schedule("sim"), schedule("real", {"gemm": 1.2})).summary()["makespan"]
    assert m["workers"] == 2
    assert m["from_task_time_s"] == pytest.approx(-2e-3, **EXACT)
    assert m["from_idle_time_s"] == pytest.approx(-2e-3, **EXACT)
    assert m["from_task_time_s"] + m["from_idle_time_s"] == pytest.approx(m["diff_s"], **EXACT)


def test_ranking_of_kernels_and_phases():
    # gemm predicted 4 ms too fast in total (5 x 0.8), softmax 1 ms too slow (5 x 0.2): shares 0.8 and 0.2.
    c = compare(schedule("sim", {"softmax": 1.2}), schedule("real", {"gemm": 1.2}))
    top = c.summary()["top_kernels"]
    assert [r["kernel"] for r in top] == ["gemm", "softmax", "add"]
    assert top[0]["diff_s"] == pytest.approx(-4e-3, **EXACT)
    assert top[0]["share"] == pytest.approx(0.8, **EXACT)
    assert top[1]["share"] == pytest.approx(0.2, **EXACT)
    phases = c.by_phase
    assert list(phases["phase"]) == ["h*/mlp", "h*/attn"]
    assert phases["share"].tolist() == pytest.approx([0.8, 0.2], **EXACT)
    tags = c.by_tag.set_index("tag")
    assert tags.loc["h3/mlp", "diff_s"] == pytest.approx(-0.8e-3, **EXACT)
    assert c.summary()["work"]["diff_s"] == pytest.approx(-3e-3, **EXACT)


def test_median_and_90th_percentile_of_spread_errors():
    # ten add tasks predicted (1 + e_i) x their measured time, e_i = 0.0 .. 0.9: median 0.45;
    # 90th percentile by linear interpolation at rank 0.9 * 9 = 8.1 -> 0.8 + 0.1 * 0.1 = 0.81.
    tasks = [("add", 1.0, 0, "x")] * 10
    real = schedule("real", tasks=tasks)
    pred = real.copy()
    pred["source"] = "sim"
    pred["end_s"] = pred["start_s"] + 1e-3 * (1 + np.arange(10) / 10)
    k = by_kernel(compare(pred, real))
    assert k.loc["add", "median_error"] == pytest.approx(0.45, **EXACT)
    assert k.loc["add", "p90_abs_error"] == pytest.approx(0.81, **EXACT)


def test_transfers_are_not_paired_but_summed():
    real = schedule("real")
    xfer = make_trace(task=[-1, -1], kernel="transfer", worker=0, node=1, start_s=[0.0, 1e-3],
                      end_s=[0.5e-3, 2e-3], bytes=[100, 300], flops=0.0, source="real", tag="")
    c = compare(schedule("sim"), pd.concat([real, xfer], ignore_index=True))
    assert len(c.pairs) == 15
    t = c.summary()["transfers"]
    assert (t["real_count"], t["real_bytes"], t["pred_count"]) == (2, 400, 0)
    assert t["real_s"] == pytest.approx(1.5e-3, **EXACT)
    # worker 0's busy time counts its tasks only, not link 0's transfers
    assert c.by_worker.set_index("worker").loc[0, "real_busy_s"] == pytest.approx(25e-3, **EXACT)


def test_partial_overlap_counts_unmatched_tasks():
    real = schedule("real")
    c = compare(schedule("sim"), real[real["task"] < 12])
    assert c.summary()["tasks"] == {"matched": 12, "pred_only": 3, "real_only": 0}


def test_busy_time_is_the_union_of_intervals():
    assert busy_time(np.array([0.0, 1.0, 1.5, 5.0]), np.array([2.0, 1.5, 3.0, 6.0])) == 4.0
    assert busy_time(np.array([]), np.array([])) == 0.0


def test_summary_is_strict_json_with_zero_length_tasks():
    real = schedule("real")
    real.loc[0, "end_s"] = real.loc[0, "start_s"]  # a task measured at 0 s has no relative error
    s = compare(schedule("sim"), real).summary()
    text = json.dumps(s, allow_nan=False)
    assert json.loads(text)["makespan"]["pred_s"] == pytest.approx(25e-3, **EXACT)


@pytest.mark.parametrize("change, message", [
    (lambda p, r: (r.assign(kernel=r["kernel"].where(r["task"] != 4, "gelu")), None), "task 4 is 'add' in PRED but"),
    (lambda p, r: (r.assign(task=r["task"] + 100), None), "share no task id"),
    (lambda p, r: (pd.concat([r, r.iloc[:1]]), None), "task 0 appears more than once"),
    (lambda p, r: (r, "swap"), "PRED: expected source 'sim'"),
    (lambda p, r: (r.drop(columns="tag"), None), "missing columns ['tag']"),
    (lambda p, r: (r.iloc[:0], None), "no task rows"),
])
def test_mismatched_traces_are_refused_with_one_line(change, message):
    pred, real = schedule("sim"), schedule("real")
    real, swap = change(pred, real)
    args = (real, pred) if swap else (pred, real)
    with pytest.raises(ComparisonError) as e:
        compare(*args)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_two_measured_runs_compare_without_source_check():
    c = compare(schedule("real", {"add": 2.0}), schedule("real"), check_sources=False)
    assert by_kernel(c).loc["add", "median_error"] == pytest.approx(1.0, **EXACT)


def test_before_and_after_recalibration():
    real = schedule("real", {"gemm": 1.2})
    c = compare(schedule("sim", {"gemm": 1.2}), real, before=schedule("sim"))
    b = c.summary()["before_after"]
    assert b["makespan_error_before"] == pytest.approx((25 - 29) / 29, **EXACT)
    assert b["makespan_error_after"] == pytest.approx(0.0, abs=1e-12)
    rows = {r["kernel"]: r for r in b["by_kernel"]}
    assert rows["gemm"]["median_error_before"] == pytest.approx(-1 / 6, **EXACT)
    assert rows["gemm"]["median_error_after"] == pytest.approx(0.0, abs=1e-12)
    assert set(rows) == {"gemm", "add", "softmax"}


def test_before_of_another_graph_is_refused():
    other = schedule("sim")
    other["task"] += 50
    with pytest.raises(ComparisonError, match="share no task id"):
        compare(schedule("sim"), schedule("real"), before=other)


def test_step_time_comes_first_with_the_makespan_as_its_part():
    real = schedule("real", {"gemm": 1.2})  # makespan 29 ms
    # predicted: the step of the trace (25 ms of tasks) took 30 ms; measured: a median step of 40 ms whose median
    # makespan was 31 ms (the traced step's own makespan is 29 ms)
    c = compare(schedule("sim", {"gemm": 1.2}), real, before=schedule("sim"), pred_step=0.031,
                real_step=(0.040, 0.031), before_step=0.027)
    s = c.summary()
    assert list(s)[:2] == ["step", "makespan"]
    st = s["step"]
    assert st["error"] == pytest.approx((31 - 40) / 40, **EXACT) == c.step_error
    assert st["pred_makespan_s"] == pytest.approx(0.029, **EXACT) and st["real_makespan_s"] == 0.031
    assert st["pred_host_s"] == pytest.approx(0.002, **EXACT) and st["real_host_s"] == pytest.approx(0.009, **EXACT)
    assert st["makespan_error"] == pytest.approx((29 - 31) / 31, **EXACT)
    assert s["makespan"]["error"] == pytest.approx(0.0, abs=1e-12)  # the traced step's own makespan
    assert s["before_after"]["step_error_before"] == pytest.approx((27 - 40) / 40, **EXACT)
    html = c._repr_html_()
    assert html.index("Step time: predicted 31.000 ms, measured 40.000 ms") < html.index("Makespan of the traced")
    # without step times (trace tables from elsewhere) the makespan is the headline, and the page says why
    plain = compare(schedule("sim"), real)
    assert plain.step_error is None and plain.summary()["step"]["pred_s"] is None
    assert "Step time: predicted and measured not recorded" in plain._repr_html_()
    assert "class=big>Makespan of the traced step" in plain._repr_html_()
