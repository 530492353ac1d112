"""One training step on StarPU: the same state in and out as the reference executor."""

from __future__ import annotations

from tilecast.reference.step import StepResult, TrainState, finish_step, load_step


def starpu_step(session, graph, state: TrainState, ids, targets, want_grads: bool = True):
    """Run one step of ``graph`` on an open :class:`StarPUSession`; returns (StepResult, trace)."""
    store = load_step(graph, state, ids, targets)
    trace = session.execute(graph, store)
    result: StepResult = finish_step(graph, store, state, want_grads)
    return result, trace
