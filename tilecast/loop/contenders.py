"""The configurations measured within a few percent of the fastest of their group, measured again side by side.

Which configuration is fastest is a comparison of measurements taken minutes
apart on a shared machine: a StarPU session of a step is one sample of where
the threads and tiles landed, and on the 2-core machines one session's
median of a 2.4 s step varied by 3% from the next one of the same
configuration (accuracy run 105: gpt2-4x512's eager at tile 192 on two
workers 2.48 and 2.51 s, prio 2.45 and 2.38 s). The fastest of sixteen such
figures is also the one most likely to have drawn a fast sample. So the
configurations whose figure is within :data:`BAND` of their group's fastest
(the ones a choice is made between) get as many sessions again, taken in
turns (A, B, C, A, B, C ...) so that a drift of the machine falls on all of
them alike; their figure is then over all their sessions.
"""

from __future__ import annotations

BAND = 0.05  # within 5% of the group's fastest: a configuration still in the running
MOST = 4  # at most this many per group (the fastest first)


def contenders(medians: list, groups: list, band: float = BAND, most: int = MOST) -> list:
    """Per group of at least two contenders, the indices of ``medians`` (measured seconds, one per
    configuration; ``groups`` their group keys) within ``band`` of the group's fastest, fastest first, at most
    ``most``; the groups in the order they first appear."""
    if len(medians) != len(groups):
        raise ValueError(f"{len(medians)} figures for {len(groups)} group keys")
    out = []
    for key in dict.fromkeys(groups):
        idx = sorted((i for i, g in enumerate(groups) if g == key), key=lambda i: medians[i])
        best = medians[idx[0]]
        near = [i for i in idx if medians[i] <= best * (1.0 + band)][:most]
        if len(near) > 1:
            out.append(near)
    return out


def contender_order(picked: list, extra: dict) -> list:
    """(configuration, session) pairs of the second look, in turns: session ``r`` of every contender of every
    group, then session ``r + 1``; ``extra`` maps a configuration to (its sessions so far, sessions to add)."""
    order = []
    for r in range(max((extra[i][1] for g in picked for i in g), default=0)):
        order += [(i, extra[i][0] + r) for g in picked for i in g if r < extra[i][1]]
    return order
