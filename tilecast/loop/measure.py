"""Measured step times on StarPU: the median of several steps after warm-up, over one or more sessions."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Measurement:
    """Step times of one configuration on StarPU and the last step's trace.

    ``rounds`` holds the step times of each StarPU session (warm-up steps
    included, the first ``warmup`` of each); the figure is the median of all
    timed steps of all rounds.
    """

    rounds: list
    warmup: int
    trace: object
    graph: object
    losses: list

    @property
    def step_s(self) -> list:
        """Every step's time, round after round, warm-up steps included."""
        return [t for r in self.rounds for t in r]

    @property
    def timed_s(self) -> np.ndarray:
        return np.asarray([t for r in self.rounds for t in r[self.warmup:]], dtype=np.float64)

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


def measure(config, steps: int = 5, warmup: int = 2, seed: int = 0, rounds: int = 1, progress=None) -> Measurement:
    """Run ``warmup + steps`` training steps of ``config`` on StarPU; time each.

    The warm-up steps let StarPU's history-based performance models (dm, dmda,
    dmdas) and the caches settle; the figure is the median of the ``steps``
    after them. With ``rounds`` > 1 the timed steps are shared among that many
    StarPU sessions, each with its own warm-up: a short step's time depends on
    the session too (where the threads landed, which memory the tiles got),
    by up to half on this kind of machine, so one session is one sample of that.
    """
    from tilecast.executor.starpu_run import run_steps

    if steps < 1 or warmup < 0 or rounds < 1:
        raise ValueError(f"need at least one timed step, no negative warm-up and at least one round, "
                         f"got {steps}, {warmup} and {rounds}")
    times, res = [], None
    for n in split_steps(steps, rounds):
        res = run_steps(config.model, config.batch, config.seq, config.tiling, config.sched, config.workers,
                        warmup + n, seed=seed, progress=progress)
        times.append(list(res.step_s))
    return Measurement(rounds=times, warmup=warmup, trace=res.trace, graph=res.graph, losses=res.losses)
