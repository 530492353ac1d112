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
"""

from __future__ import annotations

import numpy as np

#: sessions of each policy (alternated), and timed steps in each after one warm-up
PAIRS = 4
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
