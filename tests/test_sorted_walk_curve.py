"""The sorted insertion's cost per step, near the list's head and beyond (tilecast.loop.queue_probe.walk_curve):
fitted from measure_sorted's rows, whose walks are known exactly."""

import numpy as np
import pytest

from tilecast.loop.queue_probe import SORTED_SIZES, insertion_walks, walk_curve
from tilecast.simulator.queue_costs import list_walk_s


def rows_made_with(near, far, knee, noise=None):
    rows = []
    rng = np.random.default_rng(0)
    for i, n in enumerate(SORTED_SIZES):
        walks = insertion_walks(np.random.default_rng(n).permutation(n) + 1.0)
        cost = sum(list_walk_s(int(k), near, far, knee) for k in walks)
        f = 1.0 if noise is None else 1.0 + noise * rng.standard_normal()
        rows.append({"tasks": n, "distinct_s": 1e-3 + cost * f, "equal_s": 1e-3, "walks": walks})
    return rows


def test_the_fit_finds_the_costs_that_made_the_times():
    near, far, knee = walk_curve(rows_made_with(2.7e-9, 7.6e-9, 206))
    assert near == pytest.approx(2.7e-9, rel=0.05) and far == pytest.approx(7.6e-9, rel=0.05)
    assert knee == pytest.approx(206, rel=0.15)


def test_noisy_times_still_put_the_far_steps_dearer():
    near, far, knee = walk_curve(rows_made_with(2.7e-9, 7.6e-9, 206, noise=0.03))
    assert far > 2 * near and 50 < knee < 1000


def test_a_flat_cost_comes_out_flat():
    """Walks whose steps all cost the same (the list in memory order, prefetched): near and far agree."""
    near, far, _ = walk_curve(rows_made_with(2.2e-9, 2.2e-9, 0))
    assert near == pytest.approx(2.2e-9, rel=0.1) and far == pytest.approx(2.2e-9, rel=0.05)


def test_too_few_sizes_give_one_cost_for_every_step():
    rows = rows_made_with(3e-9, 9e-9, 100)[:2]
    near, far, knee = walk_curve(rows)
    assert (far, knee) == (0.0, 0.0)
    steps = sum(r["walks"].sum() for r in rows)
    assert near * steps == pytest.approx(sum(r["distinct_s"] - r["equal_s"] for r in rows), rel=0.3)
    assert walk_curve([]) == (0.0, 0.0, 0.0)
