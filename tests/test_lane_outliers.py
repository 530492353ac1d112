"""Hot and near figures that stand out from the same kernel's neighbours are timed again, and the lesser of the
two kept (tilecast.perfmodel.lane_outliers, kernel_calibration.StarPUTiming.plan_again)."""

import numpy as np
import pytest

from tilecast.loop.interference import GuardedPass
from tilecast.perfmodel.calibration import gemm_cases
from tilecast.perfmodel.lane_outliers import outlying


def _gemms():
    """27 GEMM shapes of 32-40 (bytes within a factor 2 of each other) and their cold times (flops-bound)."""
    cases = gemm_cases([32, 36, 40])
    cold = np.asarray([r[2] * r[3] * r[4] * 1e-9 for _, r in cases])
    return cases, cold


def test_a_lane_figure_far_above_its_neighbours_ratio_is_flagged():
    cases, cold = _gemms()
    hot = 0.7 * cold * np.linspace(0.95, 1.05, len(cold))  # hot at 0.67-0.74x cold, as GEMMs of this size run
    hot[5] = 1.2 * cold[5]  # a slow spell: 1.7x its neighbours' ratio
    hot[9] = 0.85 * cold[9]  # 1.2x: within the factor
    assert outlying(cases, cold, hot) == [5]


def test_a_kernel_slower_hot_than_cold_throughout_is_not_flagged():
    cases, cold = _gemms()
    hot = 1.35 * cold  # every shape 1.35x cold (ce_grad's kind): the kernel's own ratio, not a disturbance
    assert outlying(cases, cold, hot) == []
    hot[3] = 2.0 * cold[3]
    assert outlying(cases, cold, hot) == [3]


def test_shapes_without_enough_neighbours_or_figures_are_not_judged():
    cases, cold = _gemms()
    hot = 0.7 * cold
    hot[0] = 5 * cold[0]
    assert outlying(cases, cold, hot, min_neighbours=len(cases)) == []  # too few neighbours
    assert outlying(cases, cold, hot, window=1.0) == []  # a window of one size: no neighbour but equal bytes
    hot[0] = np.nan  # not timed hot: not judged
    assert outlying(cases, cold, hot) == []
    far = cases + gemm_cases([512])  # one shape with bytes over 100x the others': no neighbour to judge it by
    fc = np.append(cold, 512 ** 3 * 1e-9)
    fh = 0.7 * fc
    fh[-1] = 3 * fc[-1]
    assert outlying(far, fc, fh) == []
    with pytest.raises(ValueError, match="one time per case"):
        outlying(cases, cold[:-1], hot)


def test_calibration_times_an_outlying_hot_figure_again_and_keeps_the_lesser(monkeypatch, tmp_path):
    """time_in_starpu with passes faked: the hot pass's figure of one shape came out 1.8x its neighbours'
    ratio; a pass of that shape alone runs under the hot lane's policy, and the calibration keeps its time.
    Without the retake (a lane figure truly slow, timed slow again) the first figure stays."""
    from tilecast.loop import kernel_calibration as kc
    from tilecast.perfmodel import load_machine

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    cases, cold = _gemms()
    spelled = 7
    seen = []

    def run(retake_s):
        def fake_pass(self, what, n_workers, todo, reps, sched, near=False):
            idx = [next(j for j, x in enumerate(self.cases) if x is c) for c in todo]
            seen.append((what, sched, near, idx))

            def one():
                if what.startswith("hot again"):
                    return np.asarray([retake_s if i == spelled else 0.7 * cold[i] for i in idx])
                if what.startswith("hot"):
                    return np.asarray([1.26 * cold[i] if i == spelled else 0.7 * cold[i] for i in idx])
                return np.asarray([(0.9 if near else 1.0) * cold[i] for i in idx])
            return GuardedPass(what, one)

        monkeypatch.setattr(kc.StarPUTiming, "_pass", fake_pass)
        seen.clear()
        cal, _ = kc.time_in_starpu(load_machine("local"), None, cases, [4] * len(cases), 2)
        name, row = cases[spelled]
        j = [list(s) for s in cal.hot[name]["shapes"]].index([float(x) for x in row])
        return cal.hot[name]["median_s"][j]

    assert run(0.7 * cold[spelled]) == pytest.approx(0.7 * cold[spelled])
    again = [s for s in seen if s[0].startswith("hot again")]
    assert again == [("hot again (1 shapes)", kc.HOT_SCHED, False, [spelled])]
    assert not any(s[0].startswith("near again") for s in seen)  # the near figures are even: none again
    assert run(2.0 * cold[spelled]) == pytest.approx(1.26 * cold[spelled])  # slow twice: the lesser, the first
