"""Measured step times on StarPU: the median of several steps after warm-up, over one or more sessions."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Measurement:
    """Step times of one configuration on StarPU and the last step's trace.

    ``rounds`` holds the step times of each StarPU session (warm-up steps
    included, the first ``warmup`` of each); the figure is the median of all
    timed steps of all rounds. ``makespans`` holds the same steps' makespans
    (submission to the last task's end).
    """

    rounds: list
    warmup: int
    trace: object
    graph: object
    losses: list
    makespans: list | None = None
    traces: list | None = None  # traces of the last timed steps of every round (``trace`` is the last)

    def _timed(self, rounds) -> np.ndarray:
        return np.asarray([t for r in rounds for t in r[self.warmup:]], dtype=np.float64)

    @property
    def step_s(self) -> list:
        """Every step's time, round after round, warm-up steps included."""
        return [t for r in self.rounds for t in r]

    @property
    def timed_s(self) -> np.ndarray:
        return self._timed(self.rounds)

    @property
    def makespan_s(self) -> float:
        """Median makespan of the timed steps."""
        return float(np.median(self._timed(self.makespans)))

    @property
    def host_s(self) -> float:
        """The median step's time beyond the median makespan (so that the two add up to the figure)."""
        return self.median_s - self.makespan_s

    @property
    def median_s(self) -> float:
        return float(np.median(self.timed_s))

    @property
    def spread(self) -> float:
        """(max - min) / median of the timed steps: how steady the measurement was."""
        t = self.timed_s
        return float((t.max() - t.min()) / np.median(t))

    @property
    def round_medians_s(self) -> list:
        return [float(np.median(r[self.warmup:])) for r in self.rounds]


def split_steps(steps: int, rounds: int) -> list:
    """``steps`` timed steps shared among ``rounds`` sessions as evenly as possible (none empty)."""
    rounds = max(1, min(rounds, steps))
    return [steps // rounds + (1 if i < steps % rounds else 0) for i in range(rounds)]


TRACED_PER_ROUND = 3  # the last timed steps of a session whose traces are kept (bounded memory on big graphs)


def traced_plan(warmup: int, steps: int, traced: int = TRACED_PER_ROUND) -> tuple[int, int, list]:
    """(steps to run, the first traced step, the indices of the steps timed) of a session of ``warmup`` and
    ``steps`` timed steps whose last ``traced`` steps are traced.

    A step that follows a traced one is run but not timed: the trace is built between the two steps, in
    Python, while StarPU's workers are paused, and the next step pays for it when it resumes them (the
    submitting thread, having used its share of the cores, waits for one before it submits the first task:
    measured with ``benchmarks/step_decomposition.py``, gpt2-tiny 32 x 128, tile 64, eager, 2 workers on the
    2 cores, machine loaded: medians of 5-16 ms from the submitting call to the makespan's origin after a
    traced step in 4 of 5 runs, 0.01-0.04 ms with no step traced in 6 of 6). Back-to-back training steps, as ``tilecast run`` times them and as
    ``tilecast calibrate``'s probes measure the host cost, build no trace in between. So one more step is run
    per traced step but the first, and the timed steps are the warm-up, the untraced steps and the first
    traced step (``warmup + steps`` in all); every traced step's trace is kept.
    """
    k = min(max(traced, 1), max(steps, 0))
    total = warmup + steps + max(k - 1, 0)
    first = total - k
    return total, first, [i for i in range(total) if not (first < i < total)]


def measure_round(config, steps: int, warmup: int, seed: int = 0, progress=None, traced: int = TRACED_PER_ROUND):
    """One StarPU session of ``warmup + steps`` timed training steps (:func:`traced_plan`): (step times,
    makespans, the run's result, whose ``traces`` are those of its last ``traced`` steps)."""
    from tilecast.executor.starpu_run import run_steps
    from tilecast.reference.step import restore_built_step

    total, first, timed = traced_plan(warmup, steps, traced)
    res = run_steps(config.model, config.batch, config.seq, config.tiling, config.sched, config.workers,
                    total, seed=seed, progress=progress, trace_from=first, recompute=config.recompute)
    restore_built_step(res.graph)  # the models learn from these traces
    return [res.step_s[i] for i in timed], [res.makespan_s[i] for i in timed], res


def measurement_of(rounds: list, warmup: int) -> Measurement:
    """The Measurement of a configuration's rounds (what :func:`measure_round` returned, in order)."""
    last = rounds[-1][2]
    return Measurement(rounds=[r[0] for r in rounds], warmup=warmup, trace=last.trace, graph=last.graph,
                       losses=last.losses, makespans=[r[1] for r in rounds],
                       traces=[t for r in rounds for t in r[2].traces])


def measure(config, steps: int = 5, warmup: int = 2, seed: int = 0, rounds: int = 1, progress=None) -> Measurement:
    """Run ``warmup + steps`` training steps of ``config`` on StarPU; time each.

    The warm-up steps let StarPU's history-based performance models (dm, dmda,
    dmdas) and the caches settle; the figure is the median of the ``steps``
    after them. With ``rounds`` > 1 the timed steps are shared among that many
    StarPU sessions, each with its own warm-up: a short step's time depends on
    the session too (where the threads landed, which memory the tiles got),
    by up to 45% on this kind of machine, so one session is one sample of that.
    """
    if steps < 1 or warmup < 0 or rounds < 1:
        raise ValueError(f"need at least one timed step, no negative warm-up and at least one round, "
                         f"got {steps}, {warmup} and {rounds}")
    return measurement_of([measure_round(config, n, warmup, seed, progress) for n in split_steps(steps, rounds)],
                          warmup)
