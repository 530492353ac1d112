"""Kernel models learned from a measured trace."""

import numpy as np
import pytest
from sim_graphs import gemm_chain_graph

from tilecast.kernels import get
from tilecast.perfmodel import load_machine
from tilecast.perfmodel.from_trace import calibration_from_trace
from tilecast.perfmodel.kernel_model import DurationModel
from tilecast.perfmodel.shapes import graph_shapes
from tilecast.trace import make_trace


def _trace(graph, seconds):
    n = graph.n_tasks
    start = np.cumsum(np.concatenate(([0.0], seconds[:-1])))
    return make_trace(task=np.arange(n), kernel="gemm", worker=0, node=0, start_s=start, end_s=start + seconds,
                      bytes=0, flops=0.0, source="real", tag="")


def test_means_per_shape_become_measured_points():
    g = gemm_chain_graph(n_layers=2, tiles=2, tile=32)  # two shapes: beta 0 (first write) and beta 1
    beta = g.params[g.param_ptr[:-1] + get("gemm").params.index("beta")]
    rng = np.random.default_rng(0)
    seconds = np.where(beta == 0, 2e-5, 5e-5) * rng.uniform(0.9, 1.1, g.n_tasks)
    first = [int(np.flatnonzero(beta == b)[0]) for b in (0.0, 1.0)]
    seconds[first[0]] *= 3  # an interrupted task counts: a makespan adds tasks up
    seconds[first[1]] = 1e-3  # one preempted for a whole time slice counts 4x its shape's median, no more
    m = load_machine("local")
    cal = calibration_from_trace(g, _trace(g, seconds), m)
    assert cal.timer == "trace" and cal.fingerprint == m.fingerprint()
    med = dict(zip([s[6] for s in cal.points["gemm"]["shapes"]], cal.points["gemm"]["median_s"]))
    assert med[0.0] == pytest.approx(np.mean(seconds[beta == 0]))
    ones = seconds[beta == 1]
    assert med[1.0] == pytest.approx(np.mean(np.minimum(ones, 4 * np.median(ones))))
    assert med[1.0] > np.mean(np.sort(ones)[:-1])  # the preempted task still counts
    d = DurationModel(m, cal).durations(g)
    np.testing.assert_allclose(d[0], np.where(beta == 0, med[0.0], med[1.0]))


def test_a_trace_without_measured_tasks_is_refused():
    g = gemm_chain_graph(n_layers=1, tiles=1, tile=16)
    t = _trace(g, np.ones(g.n_tasks)).assign(source="sim")
    with pytest.raises(ValueError, match="no measured task rows"):
        calibration_from_trace(g, t, load_machine("local"))


def test_shapes_timed_alone_and_traced_give_the_runtime_excess_added_to_other_shapes(tmp_path):
    from tilecast.perfmodel.calibration import Calibration

    # gemm shapes of three sizes, traced: each 1 us + 2 ns per byte slower than timed alone
    graphs = [gemm_chain_graph(n_layers=2, tiles=2, tile=t) for t in (16, 32, 64)]
    m = load_machine("local")
    alone = Calibration(m.name, m.fingerprint(), m.kind_names[0], "c-kernels")
    gemm = get("gemm")
    for g in graphs:
        for ks in graph_shapes(g):
            for r in ks.shapes:
                alone.add("gemm", r, 1e-9 * r[2] ** 3, 0.0)
    big = np.array([0, 0, 128, 128, 128, 1.0, 1.0, 65536, 65536, 65536])  # never traced, 4x the largest bytes
    alone.add("gemm", big, 1e-3, 0.0)
    cal = alone
    for g in graphs:
        size = g.params[g.param_ptr[:-1] + gemm.params.index("m")]
        nbytes = gemm.bytes(np.repeat(4.0 * size[:, None] ** 2, 3, axis=1))
        real = 1e-9 * size ** 3 + 1e-6 + 2e-9 * nbytes
        cal = calibration_from_trace(g, _trace(g, real), m, base=cal)
    assert len(cal.runtime_samples["gemm"]) == 6  # two shapes (first write, accumulate) per size
    fixed, per_byte, largest = cal.runtime_excess("gemm")
    assert fixed == pytest.approx(1e-6, rel=1e-3) and per_byte == pytest.approx(2e-9, rel=1e-3)
    largest_traced = gemm.bytes(np.full((1, 3), 4.0 * 64 ** 2))[0]
    assert largest == pytest.approx(largest_traced)
    shapes, t = cal.arrays("gemm")
    got = dict(zip(map(tuple, shapes), t))
    # the untraced shape gets the excess, not extrapolated past the largest traced bytes
    assert got[tuple(big)] == pytest.approx(1e-3 + 1e-6 + 2e-9 * largest_traced)
    assert cal.arrays("gemm", isolated=True)[1].max() == pytest.approx(1e-3)
    # stored and read back with the points' sources and the excess
    back = Calibration.load(cal.save(str(tmp_path / "c.json")), m.fingerprint())
    assert back.runtime_samples == cal.runtime_samples and back.sources("gemm") == cal.sources("gemm")
    np.testing.assert_allclose(back.arrays("gemm")[1], t)


def test_several_traces_give_the_median_over_steps_of_each_steps_mean():
    g = gemm_chain_graph(n_layers=2, tiles=2, tile=32)
    beta = g.params[g.param_ptr[:-1] + get("gemm").params.index("beta")]
    base = np.where(beta == 0, 2e-5, 5e-5)
    steps = [base * 1.0, base * 1.1, base * 3.0]  # the third step ran in a slow spell
    steps[0] = steps[0].copy()
    steps[0][np.flatnonzero(beta == 1)[0]] *= 2  # one interrupted task in the first step
    cal = calibration_from_trace(g, [_trace(g, s) for s in steps], load_machine("local"))
    got = dict(zip([s[6] for s in cal.points["gemm"]["shapes"]], cal.points["gemm"]["median_s"]))
    means = [[s[beta == b].mean() for s in steps] for b in (0, 1)]
    assert got[0.0] == pytest.approx(np.median(means[0])) and got[0.0] == pytest.approx(2.2e-5)
    assert got[1.0] == pytest.approx(np.median(means[1]))
    assert got[1.0] > 5.5e-5  # the first step's mean, with its interrupted task, is the median of the three


@pytest.mark.parametrize("extra", [3e-5, 3e-4])  # under, and over, 4x either shape's median: counted in full
def test_many_traces_give_each_shapes_mean_over_the_central_steps(extra):
    """Each step has one interrupted task, in one shape or the other: the median over the steps of either
    shape's mean leaves the interruption out, the steps do not. Learned points add up to the central steps'
    work; a step in a slow spell, or one with no interruption, lies outside the interquartile range."""
    g = gemm_chain_graph(n_layers=2, tiles=2, tile=32)
    beta = g.params[g.param_ptr[:-1] + get("gemm").params.index("beta")]
    base = np.where(beta == 0, 2e-5, 5e-5)
    steps = []
    for i in range(8):
        s = base.copy()
        s[np.flatnonzero(beta == (0 if i < 4 else 1))[i % 4]] += extra
        steps.append(s)
    steps += [base.copy(), base.copy(), base * 3.0]  # two with no interruption; a slow spell
    cal = calibration_from_trace(g, [_trace(g, s) for s in steps], load_machine("local"))
    got = dict(zip([s[6] for s in cal.points["gemm"]["shapes"]], cal.points["gemm"]["median_s"]))
    for b in (0.0, 1.0):
        n = int((beta == b).sum())
        assert got[b] == pytest.approx(base[beta == b][0] + extra / 2 / n)  # interrupted in half the central steps
    learned = sum(got[b] * (beta == b).sum() for b in (0.0, 1.0))
    assert learned == pytest.approx(base.sum() + extra)  # every central step's work
    old = sum(np.median([s[beta == b].mean() for s in steps]) * (beta == b).sum() for b in (0.0, 1.0))
    assert old == pytest.approx(base.sum())  # what the median over the steps gave: short by the interruption
