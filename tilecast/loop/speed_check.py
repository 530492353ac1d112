"""Is this machine as fast now as when its kernels were calibrated?

A forecast is of the machine in the state its calibration timed. On the
shared 2-core guests this project is measured on, that state moves: in
accuracy run 112 (docs/accuracy.md) the quiet check's reference step took
41.3 ms at its median while the kernels were timed and 45.2 ms while the
configurations were measured, and all 56 were forecast short (by 0.3% to
20.5%, 10.6% at the median), where the same code's runs 110 and 111,
calibrated and measured in one state, were 2.9% and 3.5% off at the median.

Calibration keeps the reference step it was timed beside
(``Calibration.quiet["reference_s"]``: the median reference around its
passes, :func:`tilecast.loop.interference.reference_of`). :func:`check_speed`
times the same reference step now, on as many workers, a few times (about
2 s in all) and compares the medians: past the threshold (the quiet
check's, 12%) the forecasts of this calibration carry the difference, and
the user is told to calibrate again or to wait for the machine. The
reference is a small step: the guest's states do not slow every kernel
alike, and a check within the threshold has seen large GEMMs run 0.80-0.85x
their calibrated figures (docs/predicting.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tilecast.errors import FieldError
from tilecast.loop.interference import QuietGuard

PROBES = 5  # reference steps timed now (each the fastest of its session's three steps)
THRESHOLD = QuietGuard.threshold  # the quiet check's: how far a reference may be from the standard


@dataclass
class SpeedCheck:
    """The reference step now against the one the stored calibration was timed beside (seconds)."""

    calibrated_s: float
    now_s: float
    probes_s: list = field(default_factory=list)
    workers: int = 1
    threshold: float = THRESHOLD

    @property
    def ratio(self) -> float:
        """Now over at calibration: above 1, the machine runs slower than its calibration timed it."""
        return self.now_s / self.calibrated_s

    @property
    def within(self) -> bool:
        return abs(self.ratio - 1.0) <= self.threshold

    def line(self) -> str:
        r = self.ratio
        how = "as fast as" if abs(r - 1.0) < 0.005 else (
            f"{abs(r - 1.0):.0%} {'slower' if r > 1 else 'faster'} than")
        text = (f"reference step now {self.now_s * 1e3:.1f} ms (median of {len(self.probes_s)}, {self.workers} "
                f"worker{'s' if self.workers > 1 else ''}) against {self.calibrated_s * 1e3:.1f} ms while the "
                f"kernels were calibrated: the machine runs {how} when calibrated")
        if self.within:
            return text + f" (within {self.threshold:.0%})"
        return (text + f"; steps may take about {r:.2f}x their forecasts from this calibration (calibrate again: "
                "tilecast calibrate, or wait for the machine's usual speed)")

    def to_dict(self) -> dict:
        return {"reference_calibrated_s": self.calibrated_s, "reference_now_s": self.now_s,
                "reference_probes_s": list(self.probes_s), "ratio": self.ratio, "workers": self.workers,
                "threshold": self.threshold, "within": self.within}


def calibrated_reference(cal) -> float:
    """The reference step a calibration was timed beside (s); FieldError where it holds none."""
    ref = (cal.quiet or {}).get("reference_s") if cal is not None else None
    if not ref:
        raise FieldError("calibration: this machine has no stored calibration timed as StarPU tasks (none has the "
                         "reference step beside it): run tilecast calibrate first")
    return float(ref)


def check_speed(cal, workers: int, probes: int = PROBES, threshold: float = THRESHOLD, probe=None) -> SpeedCheck:
    """Time the quiet check's reference step ``probes`` times on ``workers`` StarPU workers (``probe``: a
    function of no argument giving one reference time, injectable) and compare their median with the one
    calibration ``cal`` was timed beside."""
    import numpy as np

    from tilecast.loop.interference import reference_step

    if isinstance(probes, bool) or not isinstance(probes, int) or probes < 1:
        raise FieldError(f"probes must be a whole number at least 1, got {probes!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not threshold > 0:
        raise FieldError(f"threshold must be a positive fraction, got {threshold!r}")
    calibrated = calibrated_reference(cal)
    take = probe if probe is not None else (lambda: reference_step(workers))
    times = [float(take()) for _ in range(probes)]
    return SpeedCheck(calibrated, float(np.median(times)), times, workers, threshold)
