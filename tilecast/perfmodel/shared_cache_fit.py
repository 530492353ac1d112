"""How much of the shared last-level cache a step's tiles keep: fitted on the executor probes' traces.

sysfs says how large the shared cache is (:func:`tilecast.perfmodel.cache_size.llc_per_core`), not how much
of it this process keeps between two uses of a tile: on a VM the cache is shared with other guests, and how
much they take moves with them. On the 2-core Xeon guest (docs/accuracy.md, 2026-12-03), with the
reference step at 25.6-27.5 ms, the steps' evicted tiles came back at the near lane's speed (the whole 240
MiB share: runs 24-26); with it at 39-40 ms, at the cold lane's, as if no shared cache were left (run 29's
first use predicted again with share 0: +0.5% bias against -11.6% with 240 MiB), though one core streaming
a working set alone still read 4-32 MiB at 30 GB/s.

The probe steps that calibration runs for the runtime's costs are traced task by task, in the state
calibration is taken in. The share is the one of a grid (0, then 1 MiB doubling up to the sysfs share)
whose lane durations (hot, near, cold, :class:`tilecast.perfmodel.kernel_model.DurationModel`) add up
closest to the traced ones, over the probe steps' tasks of kernels with near lane times. The probe graphs
are tilecast's own (:data:`tilecast.loop.host_cost.PROBES`), never a configuration being predicted.
"""

from __future__ import annotations

import numpy as np

from tilecast.perfmodel.calibration import PROBE_TRACE, Calibration

MIB = 2 ** 20
# the most the best share's lane durations may differ from the traced ones (as a ratio either way) for it to be
# kept: in run 30's first fit every share's lanes came out 5.3x the traced durations, which no share explains
MAX_MISFIT = 1.5


def lane_calibration(cal: Calibration) -> Calibration:
    """``cal`` without the points learned from traces of its own probe steps (nor from runs): what the lane
    times alone predict."""
    from tilecast.perfmodel.calibration import LEARNED

    out = cal.without_points()
    for name, e in cal.points.items():
        for shape, m, d, src, w in zip(e["shapes"], e["median_s"], e["mad_s"], cal.sources(name),
                                       cal.point_workers(name)):
            if src != PROBE_TRACE and src not in LEARNED:
                out.add(name, shape, m, d, src, w)
    return out


def share_grid(cap_bytes: float) -> list:
    """0, then 1 MiB doubling below ``cap_bytes``, then ``cap_bytes``."""
    grid, b = [0.0], float(MIB)
    while b < cap_bytes:
        grid.append(b)
        b *= 2
    return grid + ([float(cap_bytes)] if cap_bytes > 0 else [])


def lane_over_traced(cal: Calibration, machine, traced, share_bytes: float) -> float | None:
    """Sum of the lane durations over the sum of the traced ones, over the tasks of ``traced`` ((graph, trace,
    workers) each) whose kernels have near lane times, with the shared-cache share ``share_bytes``; None
    without such tasks."""
    from tilecast.kernels import all_kernels
    from tilecast.perfmodel.from_trace import task_seconds
    from tilecast.perfmodel.kernel_model import DurationModel

    lanes = lane_calibration(cal)
    lanes.llc_bytes = float(share_bytes)
    names = [k.name for k in all_kernels()]
    predicted = measured = 0.0
    for graph, trace, workers in traced:
        near = np.array([lanes.has_near(names[k]) for k in range(len(names))])[graph.kernel]
        seconds = task_seconds(graph, trace)
        use = near & np.isfinite(seconds) & (seconds > 0)
        if not use.any():
            continue
        d = DurationModel(machine.with_workers(workers), lanes).durations(graph)[0]
        predicted += float(d[use].sum())
        measured += float(seconds[use].sum())
    return predicted / measured if measured > 0 else None


def fit_share(cal: Calibration, machine, traced, cap_bytes: float) -> tuple:
    """(share in bytes, {share: lane / traced ratio}): the grid's share (:func:`share_grid` up to
    ``cap_bytes``) whose ratio is closest to 1 (in log), the largest of equals (the probe steps' tiles are
    all reused within a few MiB: shares beyond those give the same ratio, and the cache sysfs states is the
    figure to keep for the larger graphs then); (None, {}) without near lane times on the probes' kernels or
    without a cap; (None, ratios) when even the best is more than :data:`MAX_MISFIT` off."""
    if cap_bytes <= 0 or not cal.near:
        return None, {}
    ratios = {}
    for b in share_grid(cap_bytes):
        r = lane_over_traced(cal, machine, traced, b)
        if r is None:
            return None, {}
        ratios[b] = r
    best = min(ratios, key=lambda b: (abs(np.log(ratios[b])), -b))
    if abs(np.log(ratios[best])) > np.log(MAX_MISFIT):  # no share explains the traces: none is fitted
        return None, ratios
    return best, ratios


def set_fitted_share(cal: Calibration, machine, traced) -> dict:
    """Set ``cal.llc_bytes`` (and its source) to the share the probe traces fit, capped by the sysfs share;
    left as it is when nothing can be fitted. Returns {"share_bytes", "sysfs_bytes", "ratios"} (empty when
    nothing was fitted)."""
    from tilecast.perfmodel.cache_size import llc_per_core

    cap, where = llc_per_core()
    share, ratios = fit_share(cal, machine, traced, float(cap))
    if share is None:
        return {}
    cal.llc_bytes = float(share)
    cal.llc_source = (f"fitted on the executor probes' traces: {share / MIB:g} MiB of the {cap / MIB:g} MiB "
                      f"share ({where}); lane / traced {ratios[share]:.3f}")
    return {"share_bytes": float(share), "sysfs_bytes": float(cap), "ratios": ratios}


def is_fitted(cal: Calibration) -> bool:
    """Was ``cal.llc_bytes`` fitted on probe traces (then timing more kernels keeps it)?"""
    return cal.llc_source.startswith("fitted")
