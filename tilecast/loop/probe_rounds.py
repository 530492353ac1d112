"""A scheduler's probe steps taken in several sessions, its costs fitted on the median one.

Each scheduler's own costs (its cost between tasks, :mod:`tilecast.loop.runtime_overhead`, and the host
time per task beside eager's fixed and per-tile costs) were fitted on one StarPU session of the scheduler
probes, about a second long. On a 2-core AMD EPYC (Zen 4) guest, accuracy run 88's calibration fitted a cost
between tasks of 2.21 us for ws on two workers and 1.27 for lws, two policies whose push and pop take the same
path in StarPU 1.3.10 on two workers (src/sched_policies/work_stealing_policy.c); six sessions of each a few
minutes later gave 0.74-1.34 and 0.68-1.36 us. Run 88 forecast ws's two-worker rows up to 15.6% long, while
the steps of both policies ran alike (docs/accuracy.md, run 88).

So every scheduler's probes run in :data:`ROUNDS` sessions, the rounds interleaved over the schedulers
(each scheduler's sessions spread over the calibration, not taken back to back in one spell), and the fits
are made on one of them whole: the session whose mean start delay is the median of the rounds'. One session,
not a median per coefficient, because the gap model's costs are fitted together (a larger constant goes with
smaller costs per buffer); the walk's and decisions' fits, which simulate the probes, read the same
session's makespans.
"""

from __future__ import annotations

import numpy as np

#: sessions of each scheduler's probes (odd: the median is one of them)
ROUNDS = 3


def round_key(key: str, r: int) -> str:
    """The key of round ``r`` (from 0) of a probe pass keyed ``key``: the first round keeps the key."""
    return key if r == 0 else f"{key}#{r + 1}"


def mean_start_delay(result) -> float:
    """A probe session's mean start delay over its steps, weighted by their task rates (as
    :meth:`tilecast.loop.host_cost.HostCost.fit` averages them); ``result`` is
    :func:`tilecast.loop.host_cost.measure_probes`'."""
    o = np.asarray(result[1], dtype=np.float64).reshape(-1, 2)
    if not len(o) or o[:, 0].sum() <= 0:
        return float("nan")
    return float(np.average(o[:, 1], weights=o[:, 0]))


def median_round(results: list):
    """Of several sessions' probe results, the one whose mean start delay is the median (the lower of the two
    middle ones for an even count; sessions without a delay go last)."""
    if not results:
        raise ValueError("no probe session to choose from")
    delays = [mean_start_delay(r) for r in results]
    finite = sorted((i for i, d in enumerate(delays) if not np.isnan(d)), key=lambda i: delays[i])
    return results[finite[(len(finite) - 1) // 2]] if finite else results[0]
