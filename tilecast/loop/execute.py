"""Run predicted configurations on StarPU and put the measurement beside the prediction.

Optionally (``recalibrate``) each measured trace updates the kernel models
(:func:`tilecast.perfmodel.from_trace.calibration_from_trace`) and each
measured step time the host-cost fit (:func:`tilecast.loop.host_cost.learn_from_runs`):
the steps are predicted again with the updated models and both errors are reported.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import numpy as np

from tilecast.loop.measure import measure
from tilecast.loop.predict import predict, relative_error


@dataclass
class Checked:
    """One configuration, predicted and measured."""

    prediction: object
    measurement: object
    rank: int  # 1-based position in the predicted ranking
    after: object = None  # the prediction with recalibrated kernel models

    @property
    def error(self) -> float:
        return relative_error(self.prediction.step_s, self.measurement.median_s)

    @property
    def error_after(self) -> float | None:
        return None if self.after is None else relative_error(self.after.step_s, self.measurement.median_s)

    def row(self) -> dict:
        out = {"rank": self.rank, **self.prediction.row(), "real_step_s": self.measurement.median_s,
               "real_steps_s": self.measurement.step_s, "warmup_steps": self.measurement.warmup,
               "real_spread": self.measurement.spread, "error": self.error}
        if self.after is not None:
            out["pred_step_s_recalibrated"] = self.after.step_s
            out["error_recalibrated"] = self.error_after
        return out

    def comparison(self):
        """:func:`tilecast.reports.compare` of the predicted and the measured last step (with ``before``)."""
        from tilecast.reports import compare

        pred = self.after if self.after is not None else self.prediction
        before = self.prediction.result.trace() if self.after is not None else None
        return compare(pred.result.trace(), self.measurement.trace, graph=self.measurement.graph, before=before)


@dataclass
class Execution:
    checked: list = field(default_factory=list)
    calibration: object = None  # the recalibrated kernel models, when asked for
    host_costs: dict | None = None  # the host-cost fits refined with the measured steps, when asked for
    load_average: tuple = ()  # 1-minute load average before and after the runs

    def busy_note(self) -> str | None:
        """A warning when other processes shared the cores while measuring, else None."""
        cores = os.cpu_count() or 1
        # the load before the runs: during them it also counts StarPU's own (spinning) workers
        if self.load_average and self.load_average[0] > 0.75 * cores:
            return (f"note: other processes were running (load average {self.load_average[0]:.1f} on {cores} "
                    "cores before the runs): measured times include their interference")
        return None

    def rows(self) -> list:
        return [c.row() for c in self.checked]

    def save_models(self, machine) -> list:
        """Store the recalibrated kernel models and host-cost fits for the next predictions; their paths."""
        from tilecast.loop.host_cost import save_host_costs

        paths = [self.calibration.save()]
        if self.host_costs:
            paths.append(save_host_costs(machine, self.host_costs))
        return paths


MIN_TIMED_S = 1.0  # short steps are timed more often: at least this many predicted seconds of timed steps
MAX_STEPS = 30


def steps_for(predicted_s: float, steps: int, min_timed_s: float = MIN_TIMED_S) -> int:
    """Timed steps for a configuration: ``steps``, more for short steps (their times jitter more), at most 30."""
    want = int(np.ceil(min_timed_s / max(predicted_s, 1e-6)))
    return max(steps, min(MAX_STEPS, want))


def execute(predictions, ranking, machine, calibration, host_costs, steps: int = 5, warmup: int = 2,
            recalibrate: bool = False, progress: bool = True, min_timed_s: float = MIN_TIMED_S) -> Execution:
    """Measure every prediction of ``predictions`` (members of ``ranking``) on StarPU.

    Each runs ``warmup`` steps then :func:`steps_for` timed steps (``min_timed_s=0``:
    exactly ``steps``).

    Each is simulated again with its trace kept (for the comparison). With
    ``recalibrate`` the kernel models learn from every measured trace in turn
    and every configuration is predicted once more with the final models.
    """
    from tilecast.perfmodel.from_trace import calibration_from_trace

    out = Execution(calibration=calibration)
    load_before = os.getloadavg()[0]
    position = {id(p): i + 1 for i, p in enumerate(ranking)}
    for i, p in enumerate(predictions):
        cfg = p.config
        n = steps_for(p.step_s, steps, min_timed_s) if min_timed_s > 0 else steps
        if progress:
            print(f"executing {i + 1}/{len(predictions)}: {cfg.label()} ({warmup} warm-up + {n} steps)",
                  file=sys.stderr)
        m = measure(cfg, steps=n, warmup=warmup)
        full = predict(cfg, machine, calibration, host_costs, graph=m.graph, keep_result=True)
        out.checked.append(Checked(full, m, position.get(id(p), 0)))
        if recalibrate:
            out.calibration = calibration_from_trace(m.graph, m.trace, machine, base=out.calibration)
    out.load_average = (load_before, os.getloadavg()[0])
    if recalibrate:
        from tilecast.loop.host_cost import host_cost_for, learn_from_runs

        kernel_only = [predict(c.prediction.config, machine, out.calibration, None, graph=c.measurement.graph,
                               keep_result=True) for c in out.checked]
        runs = [(c.prediction.config.workers, c.prediction.config.sched, k.tiles, k.tasks, k.makespan_s,
                 c.measurement.median_s) for c, k in zip(out.checked, kernel_only)]
        out.host_costs = learn_from_runs(host_costs or {}, runs)
        for c, k in zip(out.checked, kernel_only):
            cfg = c.prediction.config
            host = host_cost_for(out.host_costs, cfg.workers, cfg.sched).seconds(k.tiles, k.tasks, k.makespan_s)
            k.host_s, k.step_s = host, k.makespan_s + host
            c.after = k
    return out
