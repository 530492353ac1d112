"""Kernel duration models: seconds per task for every worker kind, vectorised over a graph.

For each kernel and worker kind the duration of a task of a given shape is, in
order of preference:

1. the measured median of that exact shape, when a calibration holds it
   (scaled for steps on fewer workers than calibration kept busy:
   ``Calibration.worker_factor``);
2. the shape model (:mod:`tilecast.perfmodel.shape_model`), when the calibration
   holds shapes of the kernel (inside the range of the shapes timed as StarPU tasks, fitted on those
   alone, not on the probe steps' trace points: :class:`tilecast.perfmodel.shape_model.LaneFirstModel`):
   a fitted (from 3 shapes; else the roofline below), physically shaped model
   ``t = fixed + flops / rate + bytes / bandwidth`` (non-negative least squares on
   relative error, so small and large tiles weigh alike), corrected by the
   measured-to-fitted ratio of the nearest timed shapes (calibration times a
   chosen subset of a large set of shapes and predicts the others this way;
   a memory-bound shape larger than every timed one takes the ratio of those in
   its cache regime, :mod:`tilecast.perfmodel.cache_regimes`);
3. the worker kind's roofline from the machine description
   (:meth:`tilecast.perfmodel.machine.WorkerKind.roofline`).

``DurationModel.provenance`` counts the tasks of each source: ``measured``
(a timed shape), ``fitted`` (the shape model), split into ``interpolated``
(inside the kernel's timed range of flops and bytes) and ``extrapolated``
(beyond it: shapes too long or too large to time,
:mod:`tilecast.perfmodel.calibration_design`), and ``roofline``.

Shapes timed as StarPU tasks have two figures, hot and cold lane times
(:mod:`tilecast.executor.runtime_timer`); both go through 1-2 (a shape model
each), and a task's duration is ``hot + f * (cold - hot)``, ``f`` the share
of its bytes whose reuse distance in the graph exceeds the core's cache
(:mod:`tilecast.perfmodel.reuse`). Points learned from traces are in-step
durations already: their hot and cold figures are the same one. The two
figures stay attached to the returned durations
(:mod:`tilecast.perfmodel.task_lanes`), so that a simulation can compute
``f`` per worker, from what the worker running the task touched before it
(:mod:`tilecast.simulator.worker_cache`).

Models are evaluated once per distinct shape (:mod:`tilecast.perfmodel.shapes`)
and scattered to tasks with numpy.
"""

from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass

import numpy as np

from tilecast.kernels import all_kernels
from tilecast.perfmodel.shapes import graph_shapes, shape_bytes, shape_flops

from tilecast.perfmodel.shape_model import (MIN_FIT_POINTS, LaneFirstModel, RooflineBase, ShapeModel,  # noqa: F401
                                            holdout_errors, lane_points)


def _features(kernel_id: int, shapes: np.ndarray) -> np.ndarray:
    n_params = len(all_kernels()[kernel_id].params)
    flops = shape_flops(kernel_id, shapes[:, :n_params])
    nbytes = shape_bytes(kernel_id, shapes[:, n_params:])
    return np.stack([np.ones(len(shapes)), flops, nbytes], axis=1)


@dataclass
class FittedKernel:
    """``t = c[0] + c[1] * flops + c[2] * bytes`` with non-negative coefficients."""

    kernel: int
    coef: np.ndarray

    @classmethod
    def fit(cls, kernel_id: int, shapes: np.ndarray, seconds: np.ndarray) -> "FittedKernel":
        from scipy.optimize import nnls  # 0.3 s to import: only where a fit is made

        x = _features(kernel_id, shapes)
        scale = x.max(axis=0)
        scale[scale == 0] = 1.0
        w = 1.0 / seconds  # relative error
        c, _ = nnls((x / scale) * w[:, None], np.ones(len(seconds)))
        return cls(kernel_id, c / scale)

    def predict(self, shapes: np.ndarray) -> np.ndarray:
        return _features(self.kernel, shapes) @ self.coef

    def describe(self) -> dict:
        c = self.coef
        return {"fixed_us": float(c[0] * 1e6), "gflops": float(1e-9 / c[1]) if c[1] > 0 else float("inf"),
                "GBps": float(1e-9 / c[2]) if c[2] > 0 else float("inf")}


# kernel models fitted on a calibration's points, by their content (see DurationModel._fit); oldest out first
_FITTED: dict = {}
_FITTED_MAX = 512


def _points(cal, name: str, workers: int, lane: str = "cold", with_digest: bool = False, fit: bool = False
            ) -> tuple:
    """``cal.arrays(name, workers=workers, lane=lane)`` (``fit``: the lane-timed points of those,
    :func:`tilecast.perfmodel.shape_model.lane_points`; ``with_digest``: and a key of their content, hashed once),
    kept while the calibration holds the very same lists of
    points and samples at the same lengths (they only grow, by :meth:`Calibration.add`; a list replaced or grown is
    read again; the lists are referenced here, so that a replaced one cannot pass for its successor)."""
    e = cal.points.get(name) or {}
    h = cal.hot.get(name) or {}
    c = cal.near.get(name) or {}
    lists = (e.get("shapes"), e.get("median_s"), e.get("mad_s"), e.get("source"),
             cal.runtime_samples.get(name), cal.worker_samples.get(name), h.get("shapes"), h.get("median_s"),
             c.get("shapes"), c.get("median_s"))
    sizes = tuple(-1 if x is None else len(x) for x in lists)
    key = (name, workers, cal.kind, cal.timer, cal.lane_workers, lane, fit)
    held = _POINTS.get(id(cal))
    if held is None or held[0]() is not cal:
        held = _POINTS[id(cal)] = (weakref.ref(cal), {})
        for k in [k for k, (ref, _) in _POINTS.items() if ref() is None]:
            del _POINTS[k]
    hit = held[1].get(key)
    if hit is None or hit[1] != sizes or any(a is not b for a, b in zip(hit[0], lists)):
        shapes, t = (lane_points(cal, name, workers=workers, lane=lane) if fit
                     else cal.arrays(name, workers=workers, lane=lane))
        digest = (shapes.shape, hashlib.sha1(shapes.tobytes() + t.tobytes()).digest())  # _fit's key of their content
        hit = held[1][key] = (lists, sizes, (shapes, t), digest)
    return hit[2] if not with_digest else (*hit[2], hit[3])


# where a task's duration came from (DurationModel.provenance): fitted = interpolated + extrapolated
SOURCES = ("measured", "fitted", "roofline", "interpolated", "extrapolated")

_POINTS: dict = {}  # id(calibration) -> (weak reference to it, {(kernel, ...): (its lists, their lengths, arrays, digest)})


class DurationModel:
    """Durations of every task of a graph on every worker kind of a machine."""

    def __init__(self, machine, calibration=None):
        self.machine = machine
        self.calibration = calibration
        self.kinds = machine.kind_names
        self._fits: dict[tuple, ShapeModel | None] = {}  # (kernel id, lane) -> model
        self._measured: dict[tuple, dict] = {}
        self.provenance: dict[str, int] = dict.fromkeys(SOURCES, 0)
        self._caches = None
        self._workers = None  # the machine's workers of the calibrated kind
        self._cache_bytes: dict = {}  # kind -> cache_bytes(kind)

    def _calibrated(self, kind: str) -> bool:
        return self.calibration is not None and self.calibration.kind == kind

    def _fit(self, kernel_id: int, lane: str = "cold"):
        if (kernel_id, lane) not in self._fits:
            if self._workers is None:
                self._workers = sum(1 for w in self.machine.workers if w.kind == self.calibration.kind)
            workers = self._workers
            name = all_kernels()[kernel_id].name
            shapes, t, digest = _points(self.calibration, name, workers, lane, True)
            fs, ft, fit_digest = _points(self.calibration, name, workers, lane, True, fit=True)
            kind = self.machine.kinds[self.calibration.kind]
            caches = self.caches()
            # the model depends only on these points (and, below 3 of them, the kind's roofline) and the cache
            # regimes: fitted once per content and reused by every prediction made with them (tune and accuracy
            # predict many steps)
            key = (kernel_id, *digest, *fit_digest, None if len(t) >= MIN_FIT_POINTS else repr(kind), caches)
            if key not in _FITTED:
                measured = {tuple(s): v for s, v in zip(shapes.tolist(), t.tolist())}
                if len(t) >= MIN_FIT_POINTS:
                    fit = LaneFirstModel.fit(kernel_id, shapes, t, fs, ft, caches=caches)
                elif len(t):  # too few shapes to fit: the roofline, scaled by the nearest timed shapes
                    fit = ShapeModel.fit(kernel_id, shapes, t, base=RooflineBase(kernel_id, kind), caches=caches)
                else:
                    fit = None
                if len(_FITTED) >= _FITTED_MAX:
                    _FITTED.pop(next(iter(_FITTED)))
                _FITTED[key] = (fit, measured)
            self._fits[kernel_id, lane], self._measured[kernel_id, lane] = _FITTED[key]
        return self._fits[kernel_id, lane]

    def caches(self):
        """The cache regimes of the calibrated kind (:func:`tilecast.perfmodel.cache_regimes.machine_regimes`),
        for memory-bound shapes the shape model extrapolates past the timed ones."""
        if self._caches is None:
            from tilecast.perfmodel.cache_regimes import machine_regimes

            self._caches = machine_regimes(self.machine.kinds[self.calibration.kind], self.calibration)
        return self._caches

    def cache_bytes(self, kind: str) -> float:
        """The cache within which a task's inputs are hot: the worker kind's stated level-2 cache per core,
        else the calibration's, else :data:`tilecast.perfmodel.cache_size.FALLBACK_L2_BYTES`."""
        if kind not in self._cache_bytes:
            from tilecast.perfmodel.cache_size import FALLBACK_L2_BYTES

            stated = self.machine.kinds[kind].cache_bytes
            if stated > 0:
                self._cache_bytes[kind] = float(stated)
            elif self.calibration is not None and self.calibration.cache_bytes > 0:
                self._cache_bytes[kind] = float(self.calibration.cache_bytes)
            else:
                self._cache_bytes[kind] = float(FALLBACK_L2_BYTES)
        return self._cache_bytes[kind]

    def shape_seconds(self, kind: str, kernel_id: int, shapes: np.ndarray, lane: str = "cold"
                      ) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, provenance code 0 measured / 1 interpolated / 2 roofline / 3 extrapolated) for rows of
        shapes, from the cold lane times (or, ``lane="hot"`` or ``"near"``, those; see :meth:`Calibration.arrays`)."""
        out = np.empty(len(shapes))
        how = np.full(len(shapes), 2)
        have = np.zeros(len(shapes), dtype=bool)
        if self._calibrated(kind):
            fit = self._fit(kernel_id, lane)
            measured = self._measured[kernel_id, lane]
            known = [measured.get(tuple(row)) for row in shapes.tolist()]
            have = np.array([v is not None for v in known], dtype=bool)
            if have.any():
                out[have] = [v for v in known if v is not None]
                how[have] = 0
            if fit is not None and not have.all():
                out[~have] = fit.predict(shapes[~have])
                how[~have] = np.where(fit.beyond(shapes[~have]) > 0, 3, 1)
                have[:] = True
        if not have.all():  # elementwise: the roofline of the rest alone is the same figure as over all rows
            rest = shapes[~have]
            n_params = len(all_kernels()[kernel_id].params)
            out[~have] = self.machine.kinds[kind].roofline(shape_flops(kernel_id, rest[:, :n_params]),
                                                          shape_bytes(kernel_id, rest[:, n_params:]))
        return out, how

    def durations(self, graph) -> np.ndarray:
        """(n_kinds, n_tasks) seconds, rows in ``machine.kind_names`` order: a task of a kernel with hot lane
        times is interpolated between its hot and cold figures by the cold share of its bytes
        (:func:`tilecast.perfmodel.reuse.cold_fraction`); where the calibration also timed the kernel's
        shapes cold within the shared last-level cache (near lane times, ``Calibration.llc_bytes``), the
        bytes from within that cache take the near figure and only those from beyond it the cold one
        (:func:`tilecast.perfmodel.reuse.far_fraction`)."""
        from tilecast.perfmodel.reuse import cold_fraction, far_fraction, interpolate, task_bytes
        from tilecast.perfmodel.task_lanes import shared_cache_durations

        n = graph.n_tasks
        out = np.zeros((len(self.kinds), n), dtype=np.float64)
        names = ("measured", "interpolated", "roofline", "extrapolated")
        counts = np.zeros(4, dtype=np.int64)
        fraction: dict = {}  # cache bytes -> cold share per task, computed once per graph and cache size
        lanes = None  # (hot, cold - hot, graph-order cold share, near - hot, far share) once a kernel has hot times
        shapes = graph_shapes(graph)
        cal = self.calibration
        hot_kernels = {ks.kernel for ks in shapes if cal is not None and cal.has_hot(all_kernels()[ks.kernel].name)}
        near_kernels = {k for k in hot_kernels if cal.llc_bytes > 0 and cal.has_near(all_kernels()[k].name)}
        # per kind, every kernel's figures scattered to its tasks first, then each figure over all tasks at
        # once (elementwise: the same numbers as kernel by kernel, without the per-kernel array calls)
        for r, kind in enumerate(self.kinds):
            cold, how = out[r], np.empty(n, dtype=np.int64)
            hot, is_hot, near = None, None, None
            for ks in shapes:
                sec, h = self.shape_seconds(kind, ks.kernel, ks.shapes)
                cold[ks.tasks] = sec[ks.inverse]
                how[ks.tasks] = h[ks.inverse]
                if ks.kernel in hot_kernels and self._calibrated(kind):
                    if hot is None:
                        hot, is_hot, near = np.empty(n), np.zeros(n, dtype=bool), np.empty(n)
                    hot[ks.tasks] = self.shape_seconds(kind, ks.kernel, ks.shapes, lane="hot")[0][ks.inverse]
                    near[ks.tasks] = (self.shape_seconds(kind, ks.kernel, ks.shapes, lane="near")[0][ks.inverse]
                                      if ks.kernel in near_kernels else cold[ks.tasks])
                    is_hot[ks.tasks] = True
            counts += np.bincount(how, minlength=4)[:4]
            if hot is not None:
                c = self.cache_bytes(kind)
                if c not in fraction:
                    fraction[c] = cold_fraction(graph, c)
                if lanes is None:
                    lanes = tuple(np.zeros_like(out) for _ in range(5))
                    lanes[0][:] = np.nan
                h, k, f = hot[is_hot], cold[is_hot], fraction[c][is_hot]
                if cal.in_step_factor != 1.0 or cal.in_step_hot != 1.0 or cal.in_step_byte_s != 0.0:
                    # as a traced probe step ran them (tilecast.loop.step_probe): the hot figure scaled (a
                    # longer task than the probe's longest gains no more than that one: the fit's range) plus a
                    # cost per byte the task accesses, and near or cold beyond hot scaled. A shape with one
                    # figure (learned from a trace, in-step already: its hot, near and cold are that figure)
                    # keeps it. A lane timed below its hot figure (noise on a sub-microsecond shape) has a
                    # negative excess, which a factor above 1 could take below zero: every scaled figure stays
                    # >= 0, so that any share of hot, near and cold a simulation takes is a duration
                    a, two = cal.in_step_factor, k != h
                    scaled = h if cal.in_step_hot_span_s <= 0 else np.minimum(h, cal.in_step_hot_span_s)
                    excess = (cal.in_step_hot - 1.0) * scaled + cal.in_step_byte_s * task_bytes(graph)[is_hot]
                    base = np.where(two, h + excess, h)
                    k = np.maximum(base + a * (k - h), 0.0)
                    near[is_hot] = np.maximum(base + a * (near[is_hot] - h), 0.0)
                    h = base
                lanes[0][r, is_hot] = h
                lanes[1][r, is_hot] = k - h
                lanes[2][r, is_hot] = f
                if near_kernels:  # the calibrated kind: the shared cache's bytes take the near figure
                    far = far_fraction(graph, c, cal.llc_bytes)[is_hot]
                    nd = near[is_hot] - h
                    lanes[3][r, is_hot] = nd
                    lanes[4][r, is_hot] = far
                    out[r, is_hot] = shared_cache_durations(h, nd, k - h, f, far)
                else:
                    out[r, is_hot] = interpolate(h, k, f)
        self.provenance = {**dict.fromkeys(SOURCES, 0), **{names[j]: int(counts[j]) for j in range(4)},
                           "fitted": int(counts[1] + counts[3])}
        if lanes is not None:  # a simulation computes the cold share per worker from them (task_lanes)
            from tilecast.perfmodel.task_lanes import TaskLanes, attach

            hot = np.where(np.isnan(lanes[0]), out, lanes[0])  # one figure: hot is the duration, delta 0
            caches = tuple(self.cache_bytes(k) for k in self.kinds)
            if near_kernels:
                llc = tuple(float(cal.llc_bytes) if self._calibrated(k) else 0.0 for k in self.kinds)
                attach(out, TaskLanes(hot, lanes[1], caches, lanes[2], lanes[3], lanes[4], llc))
            else:
                attach(out, TaskLanes(hot, lanes[1], caches, lanes[2]))
        return out
