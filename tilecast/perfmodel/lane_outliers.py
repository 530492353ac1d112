"""Lane figures that a disturbance slowed: shapes whose hot (or near) time stands out from their neighbours'.

Calibration times every shape cold in three passes (its figure the median) but hot and near in one pass each
(:mod:`tilecast.loop.kernel_calibration`): a slow spell of a few seconds inside the hot pass, short enough
that the reference steps around the pass do not see it, then raises a run of shapes' hot figures and nothing
else. Measured on the 2-core AMD EPYC guest (accuracy run 92, an empty home): a run of GEMMs with a
transposed first operand (m 64-128, k 64-1,024) got hot figures 0.97-1.50x their cold ones, where the same
kernel's shapes of similar size ran hot at 0.6-0.8x cold (in the four calibrations before on that guest, 2-3
GEMMs a calibration stood out so; in one of them 163 in the near lane). The forecast takes the hot figure
for every task whose inputs are in cache, so the suite's rows with those shapes (gpt2-5h at 96-wide tiles,
the Llama at tile 96) came out 11-20% slow; forecast again with those figures at their neighbours' ratio,
within 9%.

A kernel's ratio of lane to cold time changes slowly with its size (GEMM: 0.3 at a few microseconds to 0.8
at a millisecond), and some kernels run hot slower than cold throughout (``ce_grad`` 1.1-1.4x in every
calibration), so a shape is compared with the same kernel's shapes of about its size: its ratio over the
median ratio of those whose bytes are within :data:`WINDOW` of its own. Those above :data:`FACTOR` are timed
again (:meth:`tilecast.loop.kernel_calibration.StarPUTiming.plan_again`) and keep the lesser of their two
figures: a disturbance only slows, and a shape that is truly slower than its neighbours is slow twice.
"""

from __future__ import annotations

import numpy as np

#: a lane figure is an outlier above this many times its neighbours' median ratio to cold
FACTOR = 1.3
#: neighbours: the same kernel's shapes whose bytes are within this factor of the shape's
WINDOW = 2.0
#: a shape with fewer neighbours than this is not judged
MIN_NEIGHBOURS = 3


def outlying(cases, cold, lane, factor: float = FACTOR, window: float = WINDOW,
             min_neighbours: int = MIN_NEIGHBOURS) -> list[int]:
    """Indices of ``cases`` ([(kernel, shape row)]) whose ``lane`` time over their ``cold`` time (arrays
    aligned with ``cases``; NaN where not timed) exceeds ``factor`` times the median of that ratio over the
    same kernel's cases with bytes within ``window`` of theirs (at least ``min_neighbours`` of them)."""
    from tilecast.kernels import get
    from tilecast.perfmodel.shapes import shape_bytes

    cold = np.asarray(cold, dtype=np.float64)
    lane = np.asarray(lane, dtype=np.float64)
    if len(cold) != len(cases) or len(lane) != len(cases):
        raise ValueError(f"cold ({len(cold)}) and lane ({len(lane)}) must have one time per case ({len(cases)})")
    by_kernel: dict = {}
    for i, (name, _) in enumerate(cases):
        if np.isfinite(cold[i]) and np.isfinite(lane[i]) and cold[i] > 0 and lane[i] > 0:
            by_kernel.setdefault(name, []).append(i)
    out = []
    span = np.log(window)
    for name, idx in by_kernel.items():
        if len(idx) <= min_neighbours:
            continue
        k = get(name)
        rows = np.asarray([cases[i][1] for i in idx], dtype=np.float64)
        logb = np.log(np.maximum(shape_bytes(k.id, rows[:, len(k.params):]), 1.0))
        ratio = lane[idx] / cold[idx]
        for j, i in enumerate(idx):
            near = np.abs(logb - logb[j]) <= span
            near[j] = False
            if near.sum() >= min_neighbours and ratio[j] > factor * np.median(ratio[near]):
                out.append(i)
    return sorted(out)
