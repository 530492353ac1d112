"""The second look at the configurations measured near their group's fastest (tilecast.loop.contenders)."""

import importlib

import pytest

from tilecast.loop.contenders import contender_order, contenders


def test_contenders_are_those_within_the_band_of_their_group_fastest_first():
    medians = [2.50, 2.40, 2.60, 2.49, 0.060, 0.059, 0.070, 1.0]
    groups = ["big", "big", "big", "big", "small", "small", "small", "alone"]
    # big: 2.40 fastest, 2.49 and 2.50 within 5%, 2.60 (8.3%) not; small: 0.059 and 0.060; alone: one, no choice
    assert contenders(medians, groups) == [[1, 3, 0], [5, 4]]
    assert contenders(medians, groups, band=0.02) == [[5, 4]]
    assert contenders(medians, groups, most=2) == [[1, 3], [5, 4]]
    with pytest.raises(ValueError, match="3 figures for 2 group keys"):
        contenders([1.0, 1.0, 1.0], ["a", "b"])


def test_the_second_look_takes_the_contenders_in_turns():
    # configuration 4 had 2 sessions and gets 2 more, configuration 1 had 1 and gets 1, 7 had 3 and gets 3
    order = contender_order([[4, 1], [7]], {4: (2, 2), 1: (1, 1), 7: (3, 3)})
    assert order == [(4, 2), (1, 1), (7, 3), (4, 3), (7, 4), (7, 5)]
    assert contender_order([], {}) == []


def test_measuring_with_groups_measures_the_near_ones_again_and_pools_their_sessions(monkeypatch):
    """Two configurations of one group measured 1% apart and a third 20% slower: the first two get as many
    sessions again as they had, taken in turns after every first session, and their figures are over all."""
    ex = importlib.import_module("tilecast.loop.execute")
    times = {"a": [1.00, 1.06], "b": [1.01, 0.99], "c": [1.20, 1.20]}  # per configuration, its sessions in order
    ran = []

    def measure_round(cfg, n, warmup):
        k = sum(1 for name in ran if name == cfg.name)
        ran.append(cfg.name)
        return [9.9] * warmup + [times[cfg.name][k]] * n, [0.0] * (warmup + n), None

    monkeypatch.setattr(ex, "measure_round", measure_round)

    class P:
        def __init__(self, name):
            self.config = type("C", (), {"name": name, "label": lambda self: name})()

    plans = [[2], [2], [2]]
    done, probes = ex._measure_sessions([P("a"), P("b"), P("c")], plans, 1, None, progress=False,
                                        groups=["g", "g", "g"])
    assert ran == ["a", "b", "c", "a", "b"]  # a (1.00) and b (1.01) within 5% of a, fastest first; c not
    assert plans == [[2, 2], [2, 2], [2]] and [len(d) for d in done] == [2, 2, 1]
    assert [r[0][1:] for r in done[0]] == [[1.00, 1.00], [1.06, 1.06]]
    ran.clear()
    without, _ = ex._measure_sessions([P("a"), P("b"), P("c")], [[2], [2], [2]], 1, None, progress=False)
    assert [len(d) for d in without] == [1, 1, 1]
