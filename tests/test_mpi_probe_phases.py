"""benchmarks/mpi_probe_costs.py's phases of a rank's worker around its main thread's submission, on a trace
whose parts are known."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from mpi_probe_costs import phase_table  # noqa: E402

US = 1e-6


def test_phases_split_a_rank_at_its_submission():
    # rank 0: two tasks while submitting (the second runs past the submission's end at 10 us), then three after
    # it with a 2 us gap and a 52 us wait (over WAIT_S); rank 1's task is not counted
    start = np.array([1, 4, 15, 22, 77, 0], dtype=float) * US
    end = np.array([3, 12, 20, 25, 80, 100], dtype=float) * US
    rank = np.array([0, 0, 0, 0, 0, 1])
    p = phase_table(start, end, rank, 0, 10 * US)
    assert (p["during"], p["after"]) == (2, 3)
    assert p["resume_s"] == pytest.approx(3 * US)  # from the end of the task begun before (12 us), not from 10 us
    assert p["span_s"] == pytest.approx(65 * US)
    assert p["kernel_s"] == pytest.approx(11 * US)
    assert p["short_gap_mean_s"] == pytest.approx((22 - 20) * US)
    assert p["waits_s"] == pytest.approx(52 * US)


def test_a_rank_that_runs_nothing_after_its_submission():
    p = phase_table(np.array([0.0]), np.array([1e-6]), np.array([0]), 0, 5e-6)
    assert (p["during"], p["after"], p["resume_s"], p["waits_s"]) == (1, 0, None, 0.0)
