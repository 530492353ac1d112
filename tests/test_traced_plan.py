"""Measured sessions time no step that follows a traced one (the trace is built between the two steps)."""

import pytest

from tilecast.graph import Tiling
from tilecast.graph.model_config import load_model
from tilecast.loop.config import StepConfig
from tilecast.loop.measure import TRACED_PER_ROUND, measure_round, traced_plan


@pytest.mark.parametrize("warmup,steps,traced", [(2, 5, 3), (0, 1, 3), (2, 2, 3), (1, 8, 3), (1, 3, 1), (0, 6, 2)])
def test_no_timed_step_follows_a_traced_one(warmup, steps, traced):
    total, first, timed = traced_plan(warmup, steps, traced)
    k = min(traced, steps)
    assert total - first == k  # the last ``traced`` steps are traced
    assert len(timed) == warmup + steps  # as many timed steps as asked for
    assert timed == sorted(set(timed)) and all(0 <= i < total for i in timed)
    assert all(i <= first for i in timed)  # none after a traced step
    assert first in timed  # the first traced step follows an untraced one: timed
    assert total == warmup + steps + k - 1  # one more step run per traced step but the first


def test_warm_up_only_runs_no_extra_step():
    assert traced_plan(2, 0) == (2, 2, [0, 1])
    assert traced_plan(3, 4, 1) == (7, 6, list(range(7)))


def test_a_measured_session_returns_its_timed_steps_and_every_traced_steps_trace():
    cfg = StepConfig(load_model("gpt2-tiny"), 2, 32, Tiling.parse("32"), "eager", 2)
    steps, makespans, res = measure_round(cfg, 3, 1)
    assert len(steps) == len(makespans) == 4
    assert len(res.step_s) == 4 + TRACED_PER_ROUND - 1
    assert len(res.traces) == TRACED_PER_ROUND
    timed = traced_plan(1, 3)[2]
    assert steps == [res.step_s[i] for i in timed] and makespans == [res.makespan_s[i] for i in timed]
