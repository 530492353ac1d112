"""The fused loops give exactly what the engine's general loop gives (hypothesis, random graphs and machines).

The general loop (Engine + policy + Memory + Links, one method call per step)
is the readable statement of the model; a policy's fused loop restates it for
speed. Both run here on the same inputs and must agree bit for bit: every
task's start, end and worker, every transfer, peak memory, evictions and write-backs.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_graphs import random_graph
from sim_machines import cpu_machine, two_device_machine

from tilecast.errors import FieldError
from tilecast.simulator.engine import Engine, SimulationError
from tilecast.simulator.simulate import simulate
from tilecast.simulator.valid_durations import CHOOSE_AMONG_KINDS

TILE = 32
TILE_BYTES = TILE * TILE * 4
FUSED = ("dm", "dmda", "dmdas")


@st.composite
def cases(draw, scheds=FUSED):
    """(graph, machine, durations, one of ``scheds``, transfers)."""
    sched = draw(st.sampled_from(list(scheds)))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    graph = random_graph(rng, draw(st.integers(1, 120)), draw(st.integers(3, 14)), TILE)
    if draw(st.integers(0, 4)) == 0:
        machine = cpu_machine(draw(st.integers(1, 4)), overhead_us=draw(st.sampled_from([0.0, 5.0])))
    else:
        machine = two_device_machine(capacity_gib=draw(st.integers(3, 16)) * TILE_BYTES / 2**30,
                                     bw_gbps=draw(st.sampled_from([0.1, 1.0, 10.0])),
                                     host_bw_gbps=draw(st.sampled_from([None, 0.5])),
                                     n_devices=draw(st.integers(1, 4)),
                                     workers_per_device=draw(st.integers(1, 2)),
                                     overhead_us=draw(st.sampled_from([0.0, 5.0])),
                                     host_workers=draw(st.integers(0, 2)))
    kinds = len(machine.kind_names)
    # coarse durations make ties (equal ends, equal expected completions) frequent
    durations = rng.integers(1, 5, size=(kinds, graph.n_tasks)) * 1e-5
    if kinds > 1 and sched in CHOOSE_AMONG_KINDS and draw(st.booleans()):
        durations[0, rng.random(graph.n_tasks) < 0.2] = np.inf  # some tasks only one kind can run
    if draw(st.integers(0, 9)) == 0:  # NaN, or inf, refused (FieldError) or not the same way on every path
        durations.flat[rng.integers(0, durations.size)] = draw(st.sampled_from([np.nan, np.inf]))
    return graph, machine, durations, sched, draw(st.booleans())


def _outcome(graph, machine, durations, sched, transfers, fused, native=False):
    """The outcome of the general loop (not ``fused``), the policy's Python fused loop (``fused``), or
    the C loop (``native``, tilecast/simulator/native.py; test_sim_native.py compares it)."""
    Engine.fused_loops = fused or native
    Engine.native_loop = native
    try:
        r = simulate(graph, machine, sched, durations=durations, transfers=transfers)
    except (SimulationError, RuntimeError, FieldError) as e:
        return f"{type(e).__name__}: {e}"
    finally:
        Engine.fused_loops = True
        Engine.native_loop = True
    s = r.summary
    return [r.start, r.end, r.worker, *r.transfers.values(),
            np.array(list(s["peak_memory_bytes"].values())), np.array([s["evictions"], s["writebacks"]])]


def assert_same_outcome(expected, got):
    """Two simulations' outcomes (arrays, or the error both raised) are equal bit for bit."""
    if isinstance(expected, str):
        assert got == expected
        return
    assert not isinstance(got, str), got
    for a, b in zip(expected, got):
        assert a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_fused_loop_equals_the_general_loop(case):
    assert_same_outcome(_outcome(*case, fused=False), _outcome(*case, fused=True))


@pytest.mark.parametrize("sched", FUSED)
def test_fused_loop_is_the_one_that_runs(sched, monkeypatch):
    """Guard against the fast path silently falling back to the general loop (the C loop off)."""
    monkeypatch.setattr(Engine, "native_loop", False)
    calls = []
    from tilecast.simulator.compiled import fused_loop_module

    fused = fused_loop_module()  # compiled where it can be built, else the interpreted module
    real = fused.run_deque_model
    monkeypatch.setattr(fused, "run_deque_model", lambda eng: calls.append(1) or real(eng))
    g = random_graph(np.random.default_rng(0), 30, 6, TILE)
    simulate(g, two_device_machine(), sched, durations=np.full((1, g.n_tasks), 1e-5))
    assert calls == [1]
