"""Steps on fewer workers than calibration kept busy: kernels run faster, by a factor measured per kernel."""

import numpy as np
import pytest

from tilecast.perfmodel.calibration import STARPU_TASKS, TRACE, Calibration


def calibration(rows, lane_workers=2):
    cal = Calibration("m", "f", "cpu", STARPU_TASKS, lane_workers=lane_workers)
    cal.worker_samples["axpy"] = rows
    return cal


def test_factor_is_the_kernels_median_ratio_and_one_for_all_workers():
    cal = calibration([[1e3, 0.9, 1.0], [1e5, 0.8, 1.0], [1e7, 0.6, 1.0], [1e8, 4.0, 1.0]])
    f = cal.worker_factor("axpy", [1e3, 1e5, 1e9], workers=1)
    assert f == pytest.approx([0.85, 0.85, 0.85])  # the median of 0.9, 0.8, 0.6, 4.0: an outlier moves nothing
    assert np.all(cal.worker_factor("axpy", [1e5], workers=2) == 1.0)
    assert np.all(cal.worker_factor("gemm", [1e5], workers=1) == 1.0)  # no samples: unscaled
    assert calibration([[1.0, 9.0, 1.0]]).worker_factor("axpy", [1.0], 1)[0] == pytest.approx(1.5)  # clipped
    three = calibration([[1e5, 0.7, 1.0]], lane_workers=3)
    assert three.worker_factor("axpy", [1e5], workers=2)[0] == pytest.approx(0.85)  # halfway to 3 workers


def test_only_the_calibrations_own_points_are_scaled():
    from tilecast.kernels import get

    k = get("axpy")
    width = len(k.params) + len(k.buffers)
    a, b = [1.0] * width, [2.0] * width
    cal = calibration([[1.0, 0.5, 1.0]])
    cal.add("axpy", a, 1e-5, 0, STARPU_TASKS)
    cal.add("axpy", b, 1e-5, 0, TRACE)  # learned from a run: whatever its workers, taken as it is
    _, t = cal.arrays("axpy", workers=1)
    assert t == pytest.approx([0.5e-5, 1e-5])
    _, t = cal.arrays("axpy", workers=2)
    assert t == pytest.approx([1e-5, 1e-5])


def test_samples_survive_saving_and_bad_ones_are_refused(tmp_path):
    from tilecast.perfmodel.calibration import CalibrationError

    cal = calibration([[1e3, 0.9, 1.0]])
    path = cal.save(str(tmp_path / "c.json"))
    back = Calibration.load(path)
    assert back.lane_workers == 2 and back.worker_samples == {"axpy": [[1e3, 0.9, 1.0]]}
    cal.worker_samples["axpy"] = [[1e3, -1, 1.0]]
    cal.save(path)
    with pytest.raises(CalibrationError, match="worker_samples.axpy"):
        Calibration.load(path)


def test_the_one_worker_sample_is_timed_hot_beside_all_workers_in_turn():
    """worker_pair_passes: the same cases hot (each chain's repeats back to back, so the cache state does not
    depend on the graph's other shapes or on how many lanes run), one worker and all of them alternated, each
    side the median of its passes."""
    from tilecast.loop import kernel_calibration as kc

    calls = []
    times = {1: iter([[1.0, 4.0], [3.0, 2.0], [2.0, 9.0]]), 2: iter([[2.0, 4.0], [4.0, 4.0], [6.0, 4.0]])}

    def passes(n_workers, cases, repeats, step, sched, count):
        calls.append((n_workers, sched, count, tuple(cases)))
        return [next(times[n_workers])]

    one, busy = kc.worker_pair_passes(passes, 2, ["a", "b"], [3, 3])
    assert [c[0] for c in calls] == [1, 2] * kc.WORKER_PASSES
    assert {c[1] for c in calls} == {kc.HOT_SCHED} and {c[2] for c in calls} == {1}
    assert {c[3] for c in calls} == {("a", "b")}  # every pass over the same cases (the same graphs)
    if kc.WORKER_PASSES == 2:
        assert one.tolist() == [2.0, 3.0] and busy.tolist() == [3.0, 4.0]
