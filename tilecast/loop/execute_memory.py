"""``tune --execute`` under ``--memory-limit``: run the chosen configurations under the limit on StarPU and put
the measured step time and disk traffic beside the forecast.

Each configuration runs in its own StarPU session with the limit (and the disk
node, given an offload directory): ``warmup`` steps, then ``steps`` timed
ones; the figures are medians over the timed steps (per step: seconds, bytes
written to and read from the disk node, transfers each way). The forecast is
the one tune ranked by (:func:`tilecast.simulator.memory_capacity.simulate_memory_limited`,
the step after a warm-up step).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from tilecast.loop.predict import relative_error


@dataclass
class LimitedRun:
    """One configuration forecast and run under the memory limit."""

    prediction: object
    rank: int  # 1-based position in the predicted ranking
    result: object  # the executor's RunResult (all steps, warm-up ones first)
    warmup: int

    def _timed(self, values: list) -> float:
        timed = values[self.warmup:] or values
        return float(np.median(timed))

    @property
    def real_step_s(self) -> float:
        return self._timed(self.result.step_s)

    @property
    def error(self) -> float:
        return relative_error(self.prediction.step_s, self.real_step_s)

    def row(self) -> dict:
        """The JSON row (``executed`` of ``tune --json``): seconds, bytes and transfers per step."""
        s, r = self.prediction.summary, self.result
        return {"rank": self.rank, **self.prediction.row(), "real_step_s": self.real_step_s,
                "real_steps_s": r.step_s, "warmup_steps": self.warmup, "error": self.error,
                "pred_disk_written_bytes": s.get("disk_written_bytes", 0),
                "real_disk_written_bytes": self._timed(r.disk_written),
                "pred_disk_read_bytes": s.get("disk_read_bytes", 0), "real_disk_read_bytes": self._timed(r.disk_read),
                "pred_disk_writes": s.get("disk_writes", 0), "real_disk_writes": self._timed(r.disk_writes),
                "pred_disk_reads": s.get("disk_reads", 0), "real_disk_reads": self._timed(r.disk_reads),
                "pred_evictions": s.get("evictions", 0), "peak_rss_bytes": r.peak_rss_bytes}

    def comparison(self, machine, calibration, host_costs, forecast):
        """:func:`tilecast.reports.compare` of the forecast and the last measured step (disk traffic included)."""
        from tilecast.loop.predict import predict
        from tilecast.reports import compare

        p = predict(self.prediction.config, machine, calibration, host_costs, graph=self.result.graph,
                    keep_result=True, memory=forecast)
        return compare(p.result.trace(), self.result.trace, graph=self.result.graph, pred_step=p.step_s,
                       real_step=(self.real_step_s, self._timed(self.result.makespan_s)))


def execute_limited(predictions, ranking, memory, steps: int = 3, warmup: int = 1,
                    progress: bool = True) -> list[LimitedRun]:
    """Run every prediction of ``predictions`` (members of ``ranking``) under ``memory`` (a
    :class:`~tilecast.executor.memory_limit.MemoryLimit`): ``warmup`` + ``steps`` steps each."""
    from tilecast.executor.starpu_run import run_steps

    position = {id(p): i + 1 for i, p in enumerate(ranking)}
    out = []
    for j, p in enumerate(predictions):
        c = p.config
        if progress:
            print(f"executing {j + 1}/{len(predictions)} under the memory limit: {c.label()} ({warmup} warm-up + "
                  f"{steps} steps)", file=sys.stderr)
        res = run_steps(c.model, c.batch, c.seq, c.tiling, c.sched, c.workers, warmup + steps,
                        recompute=c.recompute, memory=memory)
        out.append(LimitedRun(p, position.get(id(p), 0), res, warmup))
    return out


def print_limited(runs: list) -> None:
    """The table of ``tune --execute --memory-limit``: step and disk traffic, predicted / measured."""
    from tilecast.executor.memory_limit import format_size

    print("executed under the memory limit (medians of the timed steps; predicted / measured):")
    print(f"{'#':>3} {'configuration':<40}{'step s':>18}{'error':>9}{'written to disk':>24}{'read from disk':>24}"
          f"{'peak RSS':>12}")
    for r in runs:
        row = r.row()
        print(f"{r.rank:>3} {r.prediction.config.label():<40}"
              f"{row['pred_step_s']:>8.3f} / {row['real_step_s']:<7.3f}{row['error'] * 100:>+8.1f}%"
              f"{format_size(row['pred_disk_written_bytes']):>11} / {format_size(row['real_disk_written_bytes']):<10}"
              f"{format_size(row['pred_disk_read_bytes']):>11} / {format_size(row['real_disk_read_bytes']):<10}"
              f"{format_size(row['peak_rss_bytes']):>12}")
