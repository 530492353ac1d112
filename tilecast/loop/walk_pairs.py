"""A sorted policy's step against its companion's on the longest probe, in alternated StarPU sessions.

The walk a step pays (:mod:`tilecast.loop.walk_in_step`) is fitted on one ratio: dmdas's makespan of the
longest scheduler probe (gpt2-tiny 8 x 128 at tile 16, 13,402 tasks) over dmda's. Each policy's figure came from
one session of its own (:func:`tilecast.loop.host_cost.measure_probes`), minutes apart, and a short step's time
depends on its session (where the threads landed, which memory the tiles got). On two workers of the 2-core
Intel Xeon guest that one ratio came out 1.22, 1.13, 1.05 and 1.01 in four calibrations of one morning (the
homes of accuracy runs 74-77), and the walk fitted on it 84.9, 56.2, 30.4 and 5.0 ns a step; the suite's
two-worker `dmdas` and `dmdasd` rows followed it (the Llama's `dmdas` at tile 64 -1.2% to -15.5%). Here the two
policies' sessions alternate, ``pairs`` times each, and the ratio is the median of the pairs'
(:func:`pair_ratio`), so that the machine's state while one policy ran is also the other's: four pairs of 3
steps each gave 1.09-1.18 (median 1.14) on two workers and 1.06-1.17 (1.11) on one, in 9 and 5 s.

Four pairs were too few. On the AMD EPYC Zen 4 guest single pairs spread 0.82-1.31 on one worker and 1.01-1.78 on
two (one calibration, three sets of eight), and the one-worker walk, whose simulated ratio moves 0.19 per 10 ns,
came out 15.3 and 13.1 ns from four pairs in two calibrations (the homes of accuracy runs 97 and 98) against
5.3-8.2 ns in four others; gpt2-4x128's dmdas-family rows at tile 32 followed it (+16.5%, +11.5% on one worker).
Three sets of eight pairs in run 98's home had medians 1.119-1.139 on one worker (6.3-7.3 ns) and 1.171-1.201 on
two, in 9-11 s a set: :data:`PAIRS` is ten.
"""

from __future__ import annotations

import numpy as np

#: sessions of each policy (alternated), and timed steps in each after one warm-up
PAIRS = 10
REPEATS = 3


def measure_walk_pairs(workers: int, sched: str, companion: str, pairs: int = PAIRS, repeats: int = REPEATS,
                       progress=None) -> list:
    """[(``sched``'s median makespan, ``companion``'s)] of ``pairs`` pairs of sessions on the scheduler probe with
    the most tasks, ``sched`` first in one pair, the companion first in the next."""
    from tilecast.loop.host_cost import SCHED_PROBES, measure_walls, probe_graphs
    from tilecast.loop.walk_in_step import longest_probe

    longest = SCHED_PROBES[longest_probe([g for *_, g in probe_graphs(SCHED_PROBES)])]
    out = []
    for k in range(pairs):
        order = (sched, companion) if k % 2 == 0 else (companion, sched)
        got = {s: measure_walls(workers, (longest,), repeats, s, progress)[0][1] for s in order}
        out.append((got[sched], got[companion]))
    return out


def pair_ratio(pairs: list) -> float | None:
    """The median over ``pairs`` of the sorted policy's makespan over its companion's; None without pairs."""
    ratios = [a / b for a, b in pairs if a > 0 and b > 0]
    return float(np.median(ratios)) if ratios else None
