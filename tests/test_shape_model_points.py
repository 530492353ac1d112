"""Inside the range of the shapes timed as StarPU tasks, the shape model predicts from those alone: a point learned
from a calibration probe step's trace gives its own shape's figure, but does not carry its step's context to the
shapes beside it; beyond that range every point is fitted."""

import numpy as np

from tilecast.kernels import all_kernels
from tilecast.perfmodel import kernel_model, load_machine
from tilecast.perfmodel.calibration import PROBE_TRACE, STARPU_TASKS, Calibration
from tilecast.perfmodel.shape_model import holdout_errors

GEMM = [k.name for k in all_kernels()].index("gemm")


def _shape(m, n, k, beta=0.0):
    return [0, 0, m, n, k, 1.0, beta, 4 * m * k, 4 * k * n, 4 * m * n]


def _law(m, n, k):
    return 1e-6 + 2 * m * n * k / 2e10


def _calibration(machine, probe_factor):
    """Lane-timed GEMMs on one law, and a probe step's trace point (64 x 64 x 256) ``probe_factor`` times it."""
    cal = Calibration(machine.name, machine.fingerprint(), "cpu", STARPU_TASKS)
    for m, n, k in ((32, 32, 32), (64, 64, 64), (64, 256, 64), (128, 128, 64), (64, 64, 128), (128, 128, 128),
                    (64, 128, 64), (256, 256, 256)):
        cal.add("gemm", _shape(m, n, k), _law(m, n, k), 0.0, STARPU_TASKS)
    cal.add("gemm", _shape(64, 64, 256), probe_factor * _law(64, 64, 256), 0.0, PROBE_TRACE)
    return cal


def _seconds(machine, cal, shape):
    kernel_model._FITTED.clear()
    kernel_model._POINTS.clear()
    model = kernel_model.DurationModel(machine, cal)
    return float(model.shape_seconds("cpu", GEMM, np.asarray([shape], dtype=np.float64))[0][0])


def test_a_probe_trace_point_does_not_move_its_untimed_neighbour():
    machine = load_machine("local").with_workers(1)
    untimed = _shape(64, 128, 128)  # the same flops as the probe's shape, nearly the same bytes
    plain = _seconds(machine, _calibration(machine, 1.0), untimed)
    slow_probe = _seconds(machine, _calibration(machine, 2.2), untimed)
    # fitted on every point, the neighbour's ratio of 2.2 took the untimed shape to about twice its law
    assert abs(slow_probe / plain - 1.0) < 0.02
    assert abs(slow_probe / _law(64, 128, 128) - 1.0) < 0.15


def test_the_probe_trace_point_keeps_its_own_shape():
    machine = load_machine("local").with_workers(1)
    cal = _calibration(machine, 2.2)
    own = _seconds(machine, cal, _shape(64, 64, 256))
    assert own == 2.2 * _law(64, 64, 256)


def test_a_shape_smaller_than_every_lane_timed_one_is_predicted_from_every_point():
    """Probe trace points of small GEMMs on the law; lane-timed shapes from 64^3 up on 4x the law: a 16^3 GEMM,
    beyond the lane-timed range, takes the probe points' evidence (the law), not the lane-timed shapes' 4x."""
    machine = load_machine("local").with_workers(1)
    cal = Calibration(machine.name, machine.fingerprint(), "cpu", STARPU_TASKS)
    for m in (64, 96, 128, 192, 256):
        cal.add("gemm", _shape(m, m, m), 4.0 * _law(m, m, m), 0.0, STARPU_TASKS)
    for m in (8, 12, 20, 24):
        cal.add("gemm", _shape(m, m, m), _law(m, m, m), 0.0, PROBE_TRACE)
    small = _seconds(machine, cal, _shape(16, 16, 16))
    assert abs(small / _law(16, 16, 16) - 1.0) < 0.3
    inside = _seconds(machine, cal, _shape(160, 160, 160))  # inside the lane-timed range: their 4x
    assert abs(inside / (4.0 * _law(160, 160, 160)) - 1.0) < 0.15


def test_the_held_out_error_is_that_of_the_points_the_model_is_fitted_on():
    machine = load_machine("local").with_workers(1)
    errors = holdout_errors(_calibration(machine, 2.2), kernels=["gemm"])["gemm"]
    assert errors["n_fit"] == 8  # the lane-timed shapes, not the probe's
    assert errors["median_rel_err"] < 0.1


def test_a_shape_timed_both_ways_is_a_neighbour_by_its_lane_figure():
    """A shape timed as StarPU tasks and learned from a probe step's trace too: every point set has as many shapes
    as the lane-timed one, but its figure is the probe's; the untimed neighbour still takes the lane figure."""
    machine = load_machine("local").with_workers(1)
    cal = _calibration(machine, 2.2)
    cal.add("gemm", _shape(64, 64, 256), _law(64, 64, 256), 0.0, STARPU_TASKS)
    neighbour = _seconds(machine, cal, _shape(64, 128, 128))
    assert abs(neighbour / _law(64, 128, 128) - 1.0) < 0.15
    assert _seconds(machine, cal, _shape(64, 64, 256)) == 2.2 * _law(64, 64, 256)  # its own: the probe's, as before
