"""Measured step times on StarPU: the median of several steps after warm-up."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Measurement:
    """Step times of one configuration on StarPU (all steps, warm-up included) and the last step's trace."""

    step_s: list
    warmup: int
    trace: object
    graph: object
    losses: list

    @property
    def median_s(self) -> float:
        return float(np.median(self.step_s[self.warmup:]))

    @property
    def spread(self) -> float:
        """(max - min) / median of the timed steps: how steady the measurement was."""
        t = np.asarray(self.step_s[self.warmup:])
        return float((t.max() - t.min()) / np.median(t))


def measure(config, steps: int = 5, warmup: int = 2, seed: int = 0, progress=None) -> Measurement:
    """Run ``warmup + steps`` training steps of ``config`` on StarPU; time each.

    The warm-up steps let StarPU's history-based performance models (dm, dmda,
    dmdas) and the caches settle; the figure is the median of the ``steps``
    after them.
    """
    from tilecast.executor.starpu_run import run_steps

    if steps < 1 or warmup < 0:
        raise ValueError(f"need at least one timed step and no negative warm-up, got {steps} and {warmup}")
    res = run_steps(config.model, config.batch, config.seq, config.tiling, config.sched, config.workers,
                    warmup + steps, seed=seed, progress=progress)
    return Measurement(step_s=list(res.step_s), warmup=warmup, trace=res.trace, graph=res.graph, losses=res.losses)
