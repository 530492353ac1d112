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


def measure_round(config, steps: int, warmup: int, seed: int = 0, progress=None):
    """One StarPU session of ``warmup + steps`` training steps: (step times, makespans, the run's result,
    whose ``traces`` are those of its last ``TRACED_PER_ROUND`` timed steps)."""
    from tilecast.executor.starpu_run import run_steps
    from tilecast.reference.step import restore_built_step

    res = run_steps(config.model, config.batch, config.seq, config.tiling, config.sched, config.workers,
                    warmup + steps, seed=seed, progress=progress,
                    trace_from=warmup + max(0, steps - TRACED_PER_ROUND), recompute=config.recompute)
    restore_built_step(res.graph)  # the models learn from these traces
    return list(res.step_s), list(res.makespan_s), res


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
