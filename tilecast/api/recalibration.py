"""``tc.recalibrate``: learn kernel durations from a measured run (what ``tune --execute K --recalibrate`` does
after its runs, through :func:`tilecast.perfmodel.from_trace.calibration_from_trace`) into a calibration file
that ``tc.simulate(calibration=...)`` reads; the stored calibration is left as it was."""

from __future__ import annotations

from dataclasses import dataclass, field

from tilecast.api.base import _Result
from tilecast.errors import FieldError


@dataclass
class RecalibrateResult(_Result):
    """What a run taught: ``to_frame()`` has one row per kernel and shape learned from the run."""

    machine: str
    path: str  # the learned calibration's file: pass it to tc.simulate(calibration=...)
    kernels: int  # kernels with a shape learned from the run
    shapes: int  # (kernel, shape) points learned from the run
    new_shapes: int  # of those, shapes the calibration had no point for
    median_change: float | None  # median of learned / before - 1 over the shapes that had a point
    summary: dict = field(repr=False, default_factory=dict)
    calibration: object = field(repr=False, default=None)  # tilecast.perfmodel.calibration.Calibration
    rows: list = field(repr=False, default_factory=list)
    _title = "recalibrate"

    def to_frame(self):
        """``kernel``, ``shape`` (kernel parameters + buffer bytes), ``before_s`` (the calibration's point, NaN
        where it had none), ``learned_s`` (the run's, s) and ``change`` (learned / before - 1)."""
        import pandas as pd

        return pd.DataFrame(self.rows, columns=["kernel", "shape", "before_s", "learned_s", "change"])

    def _headline(self) -> str:
        change = "" if self.median_change is None else f", median change {self.median_change:+.1%}"
        return (f"learned {self.shapes} shape(s) of {self.kernels} kernel(s) from the run ({self.new_shapes} new"
                f"{change}): {self.path}")


def recalibrate(run, machine="local", out: str | None = None) -> RecalibrateResult:
    """Learn kernel durations from ``run`` (a :func:`run` result, or a list of them, of this machine) on top of
    the machine's stored calibration, and save them to ``out`` (default:
    ``$TILECAST_HOME/calibration/recalibrated-<machine>.json``)."""
    import math
    import statistics

    from tilecast.api import RunResult
    from tilecast.home import home
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.calibration import TRACE, find_calibration
    from tilecast.perfmodel.from_trace import calibration_from_trace
    from tilecast.perfmodel.machine import Machine

    runs = list(run) if isinstance(run, (list, tuple)) else [run]
    if not runs or not all(isinstance(r, RunResult) and r.trace is not None and r.graph is not None for r in runs):
        raise FieldError("run must be a tc.run result (or a list of them) holding its trace and graph")
    if len({(r.model, r.batch, r.seq, r.tiling, r.recompute) for r in runs}) > 1:
        raise FieldError("run: the runs must be of one configuration (model, batch, seq, tiling)")
    m = machine if isinstance(machine, Machine) else load_machine(machine)
    base = find_calibration(m)
    learned = calibration_from_trace(runs[0].graph, [r.trace for r in runs], m, base=base)
    path = learned.save(out or str(home("calibration", f"recalibrated-{m.name}.json")))
    before = {}
    if base is not None:
        for name, e in base.points.items():
            for shape, s in zip(e["shapes"], e["median_s"]):
                before[(name, tuple(shape))] = s
    rows = []
    for name, e in learned.points.items():
        for shape, s, src in zip(e["shapes"], e["median_s"], learned.sources(name)):
            key = (name, tuple(shape))
            if src != TRACE or _kept(base, key, s):
                continue
            b = before.get(key, math.nan)
            rows.append([name, list(shape), b, float(s), float(s) / b - 1 if b > 0 else math.nan])
    changes = [r[4] for r in rows if not math.isnan(r[4])]
    summary = {"kernels": len({r[0] for r in rows}), "shapes": len(rows),
               "new_shapes": sum(math.isnan(r[2]) for r in rows),
               "median_change": statistics.median(changes) if changes else None}
    return RecalibrateResult(m.name, path, summary["kernels"], summary["shapes"], summary["new_shapes"],
                             summary["median_change"], summary, learned, rows)


def _kept(base, key, seconds) -> bool:
    """Whether ``base`` already held this trace-learned point with the same duration (kept, not learned now)."""
    from tilecast.perfmodel.calibration import TRACE

    if base is None or key[0] not in base.points:
        return False
    e = base.points[key[0]]
    return any(tuple(sh) == key[1] and s == seconds and src == TRACE
               for sh, s, src in zip(e["shapes"], e["median_s"], base.sources(key[0])))
