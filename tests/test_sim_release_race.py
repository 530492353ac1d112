"""The worker whose task ended pushes all that it released before it pops again (Policy.pops_after_pushing):
an idle worker, spinning in its pop, takes the first released tasks, and may come back for more while the
other still releases. Measured on StarPU 1.3.10 in tests/test_starpu_policies.py (a chain of GEMMs moves to
the idle worker at nearly every link under eager, ws, lws and prio)."""

import numpy as np
import pytest

from tilecast.simulator.engine import Engine
from tilecast.simulator.simulate import POLICIES, USES_PRIORITIES


def _fan_out(sched: str, release_s: float):
    """Task 0 (10 us) makes tasks 1 (1 us), 2 and 3 (10 us each) ready; two workers; the worker that ran task 0
    spends ``release_s`` releasing it. Returns each task's worker."""
    duration = np.array([[10e-6, 1e-6, 10e-6, 10e-6]])
    pred_ptr = np.array([0, 0, 1, 2, 3])
    pred = np.array([0, 0, 0], dtype=np.int32)
    prio = np.array([3.0, 2.0, 1.0, 1.0]) if sched in USES_PRIORITIES else None  # as simulate() gives them
    policy = POLICIES[sched](prio, 0, None)
    eng = Engine(duration, pred_ptr, pred, [0, 0], [0, 0], policy, release=[release_s, 0.0, 0.0, 0.0]).run()
    return eng.arrays()[2].tolist()


@pytest.mark.parametrize("sched", ["eager", "prio", "ws", "lws"])
def test_an_idle_worker_takes_what_another_releases_while_it_releases(sched):
    a = _fan_out(sched, 5e-6)[0]
    # the idle worker takes task 1 at once, ends it (1 us) before the other has released task 0 (5 us) and
    # takes task 2 too; the releasing worker pops task 3 once it is done
    assert _fan_out(sched, 5e-6) == [a, 1 - a, 1 - a, a]
    # released at once, the ending worker gets task 2 (the idle one took task 1 first)
    assert _fan_out(sched, 0.0) == [a, 1 - a, a, 1 - a]


@pytest.mark.parametrize("sched", ["dm", "dmda", "random"])
def test_a_policy_that_decides_at_push_keeps_its_choice(sched):
    """Where the push decides the worker, the race does not: the same placement whatever the release costs."""
    assert _fan_out(sched, 5e-6) == _fan_out(sched, 0.0)
