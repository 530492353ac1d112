"""Ranking figures of a suite of predicted and measured step times, on hand-worked cases."""

import pytest

from tilecast.reports.ranking import ranking_accuracy


def test_same_order_small_errors():
    r = ranking_accuracy([1.0, 2.0, 3.0, 4.0], [1.25, 2.0, 2.5, 4.0])
    # errors 0.2, 0, 0.2, 0 -> median 0.1, max 0.2
    assert r["median_abs_error"] == pytest.approx(0.1)
    assert r["max_abs_error"] == pytest.approx(0.2)
    assert r["kendall_tau"] == pytest.approx(1.0)
    assert r["best_gap"] == 0.0 and r["predicted_best"] == r["measured_best"] == 0


def test_one_swapped_pair_and_a_wrong_best():
    # the two fastest swap: 5 of 6 pairs concordant -> tau = (5 - 1) / 6; the predicted best
    # (index 0) measures 2.2 against the best 2.0 -> gap 0.1
    r = ranking_accuracy([1.0, 2.0, 3.0, 4.0], [2.2, 2.0, 3.0, 4.0])
    assert r["kendall_tau"] == pytest.approx(4 / 6)
    assert r["best_gap"] == pytest.approx(0.1)
    assert (r["predicted_best"], r["measured_best"]) == (0, 1)


def test_bad_input():
    with pytest.raises(ValueError, match="equally long"):
        ranking_accuracy([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="positive"):
        ranking_accuracy([1.0], [0.0])
    assert ranking_accuracy([1.0], [2.0])["kendall_tau"] is None
