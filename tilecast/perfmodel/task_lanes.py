"""A task's two lane figures, hot and cold, kept beside the durations interpolated from them in graph order.

:meth:`tilecast.perfmodel.kernel_model.DurationModel.durations` returns one
duration per task and worker kind: ``hot + f * (cold - hot)`` with ``f`` read
from the graph's submission order (:func:`tilecast.perfmodel.reuse.cold_fraction`).
That is all a report on the graph alone can use. A simulation knows more: which
worker runs each task and what that worker touched before it, so it computes
``f`` when a task starts (:mod:`tilecast.simulator.worker_cache`). For that it
needs the two figures, which :func:`attach` keeps beside the durations array
and :func:`lanes_of` gives back for that very array, as long as it still holds
the graph-order durations (an array scaled or edited since is taken as given).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TaskLanes:
    """Per worker kind (rows in ``machine.kind_names`` order) and task: the hot figure and ``cold - hot``
    (0.0 where a task has one figure: no hot lane time, a duration learned from a trace, a roofline);
    ``cache_bytes`` per kind, the cache within which a tile is hot; ``fraction`` the graph-order cold share
    that gave the durations (``hot + fraction * delta``).

    With a shared last-level cache (``llc_bytes`` per kind, 0 for none): ``near_delta`` is ``near - hot``
    (the near lane time, cold within that cache; ``delta`` where a task has none) and ``far`` the graph-order
    share of the bytes from beyond it, so that the durations are ``hot + (fraction - far) * near_delta +
    far * delta``. Without (``far`` None) the bytes beyond the level-2 cache are all far."""

    hot: np.ndarray
    delta: np.ndarray
    cache_bytes: tuple
    fraction: np.ndarray
    near_delta: np.ndarray | None = None
    far: np.ndarray | None = None
    llc_bytes: tuple = ()

    def static_durations(self) -> np.ndarray:
        """The graph-order durations: ``hot + fraction * delta`` (:func:`tilecast.perfmodel.reuse.interpolate`'s
        operations), or with a shared cache :func:`shared_cache_durations`."""
        if self.far is None:
            return self.hot + self.fraction * self.delta
        return shared_cache_durations(self.hot, self.near_delta, self.delta, self.fraction, self.far)


def shared_cache_durations(hot, near_delta, delta, fraction, far) -> np.ndarray:
    """``hot + (fraction - far) * near_delta + far * delta``, kept at or above 0: a share of hot, near and cold
    figures that are, whose three terms can round below it (one definition for :class:`DurationModel
    <tilecast.perfmodel.kernel_model.DurationModel>` and :meth:`TaskLanes.static_durations`, which must agree bit
    for bit)."""
    return np.maximum(hot + (fraction - far) * near_delta + far * delta, 0.0)


_HELD: dict = {}  # id(durations array) -> (weak reference to it, its TaskLanes)


def attach(durations: np.ndarray, lanes: TaskLanes) -> None:
    """Keep ``lanes`` for the array ``durations`` (while it lives)."""
    key = id(durations)
    _HELD[key] = (weakref.ref(durations, lambda _ref, key=key: _HELD.pop(key, None)), lanes)


def lanes_of(durations) -> TaskLanes | None:
    """The lanes attached to this very array, if it still holds the durations they give; else None."""
    held = _HELD.get(id(durations))
    if held is None or held[0]() is not durations:
        return None
    lanes = held[1]
    d = np.asarray(durations)
    if d.shape != lanes.hot.shape or not np.array_equal(d, lanes.static_durations(), equal_nan=True):
        return None
    return lanes
