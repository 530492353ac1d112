"""The shape model: a kernel's duration for a shape never timed, from the timed shapes nearest to it.

A shape is described by its features: flops, bytes moved (both in decades,
so that their difference is the arithmetic intensity) and the kernel's
mode flags (transposes, causal mask, accumulate), which change the code
path but not the work. The model has two parts:

- a physical fit over all timed shapes, ``fixed + flops / rate + bytes /
  bandwidth`` (:class:`tilecast.perfmodel.kernel_model.FittedKernel`);
- a correction from the neighbours: the ratio of measured to fitted time of
  the :data:`NEIGHBOURS` timed shapes nearest in feature space, averaged in
  log space with weights ``1 / distance**2``. It carries what the straight
  line misses (a BLAS that runs small tiles at a lower rate, a cache size
  crossed) from the shapes beside the one predicted.

A timed shape is predicted as its own measured time (distance zero), and so
is every shape with the same features (e.g. an attention tile at another
offset). A shape inside the range of the shapes timed as StarPU tasks is
predicted from those alone (:class:`LaneFirstModel`, :func:`lane_points`),
not from the points learned from the traces of calibration's own probe
steps. Such a point has one figure for every lane, the time its shape took
in that probe step, and as a neighbour it carried that step's context to
shapes it never ran: a 64 x 128 x 128 GEMM was forecast 46 us in every lane
from a 64 x 64 x 256 one that took 47 us in a 163-task probe step, where it
ran 21 us in the steps that use it and its lane-timed neighbours 15-25 us.
Beyond that range the probe points are the evidence nearest, and every
point is fitted: without them, the 32-row GEMMs of a batch-1 step, smaller
than every lane-timed one, were extrapolated 8x too long.
:func:`holdout_errors` is the model's error on timed shapes left out of its
fit.

A shape beyond the timed range (more, or fewer, flops or bytes than every
timed shape of its kernel: :meth:`ShapeModel.beyond`) is *extrapolated*: the
physical fit carries it in flops and bytes, and the correction is that of the
largest (or smallest) timed shapes, its nearest. Calibration leaves the shapes
too long or too large to time this way
(:mod:`tilecast.perfmodel.calibration_design`), and
:func:`extrapolation_errors` measures the model's error there: the largest
timed shapes predicted from the smaller ones alone. Given the machine's cache
regimes (:mod:`tilecast.perfmodel.cache_regimes`), a memory-bound kernel
extrapolated to larger shapes takes the correction of the timed shapes in the
predicted shape's cache regime, not of those that fit a cache it outgrows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial import cKDTree

from tilecast.kernels import all_kernels, get
from tilecast.perfmodel.cache_regimes import CacheRegimes, working_set
from tilecast.perfmodel.calibration import PROBE_TRACE
from tilecast.perfmodel.shapes import shape_bytes, shape_flops

NEIGHBOURS = 4
# Mode flags (value > 0 or not) that select a kernel's code path; distance between two shapes that differ in
# one, in decades of flops or bytes: a shape of the same mode half a decade away counts as near as one of the
# other mode at the same size.
FLAG_PARAMS = ("trans_a", "trans_b", "causal", "beta", "sign")
FLAG_DISTANCE = 0.5
MIN_FIT_POINTS = 3
# sources of points that shapes inside the range of the others are not predicted from (LaneFirstModel)
NOT_NEIGHBOURS = (PROBE_TRACE,)


def lane_points(calibration, kernel: str, workers: int | None = None, lane: str = "cold"
                ) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`Calibration.arrays`' points of ``kernel`` but those of :data:`NOT_NEIGHBOURS`: the shapes timed as
    StarPU tasks (and any learned from runs), whose lanes are their own."""
    return calibration.arrays(kernel, workers=workers, lane=lane, exclude=NOT_NEIGHBOURS)


def flag_columns(kernel_id: int) -> list[int]:
    return [j for j, p in enumerate(all_kernels()[kernel_id].params) if p in FLAG_PARAMS]


def shape_features(kernel_id: int, shapes: np.ndarray) -> np.ndarray:
    """(n, 2 + flags): log10 flops, log10 bytes, then each mode flag (0 or :data:`FLAG_DISTANCE`)."""
    shapes = np.atleast_2d(np.asarray(shapes, dtype=np.float64))
    n_params = len(all_kernels()[kernel_id].params)
    flops = shape_flops(kernel_id, shapes[:, :n_params])
    nbytes = shape_bytes(kernel_id, shapes[:, n_params:])
    cols = [np.log10(np.maximum(flops, 1.0)), np.log10(np.maximum(nbytes, 1.0))]
    cols += [FLAG_DISTANCE * (shapes[:, j] > 0) for j in flag_columns(kernel_id)]
    return np.stack(cols, axis=1)


@dataclass
class ShapeModel:
    """A kernel's physical fit corrected by the measured-to-fitted ratio of the nearest timed shapes."""

    kernel: int
    base: object  # FittedKernel
    features: np.ndarray  # of the timed shapes
    log_ratio: np.ndarray  # log(measured / base) of each timed shape
    caches: CacheRegimes | None = None  # the machine's cache regimes (None: extrapolated without them)
    working_set: np.ndarray | None = None  # bytes of each timed shape's buffers

    @classmethod
    def fit(cls, kernel_id: int, shapes: np.ndarray, seconds: np.ndarray, base=None,
            caches: CacheRegimes | None = None) -> "ShapeModel":
        """``base``: the physical model to correct (default: fitted on these shapes; pass e.g. a
        :class:`RooflineBase` when there are fewer than :data:`MIN_FIT_POINTS`). ``caches``: the machine's
        cache regimes, for memory-bound shapes extrapolated past the timed ones (:meth:`predict`)."""
        from tilecast.perfmodel.kernel_model import FittedKernel

        shapes = np.asarray(shapes, dtype=np.float64)
        seconds = np.asarray(seconds, dtype=np.float64)
        base = base if base is not None else FittedKernel.fit(kernel_id, shapes, seconds)
        ratio = seconds / np.maximum(base.predict(shapes), 1e-12)
        return cls(kernel_id, base, shape_features(kernel_id, shapes), np.log(ratio), caches,
                   working_set(kernel_id, shapes) if caches is not None else None)

    def _corrected(self, base: np.ndarray, z: np.ndarray, among: np.ndarray | None = None) -> np.ndarray:
        """``base`` times the weighted ratio of the nearest timed shapes (only rows ``among`` of them)."""
        feats, logs = (self.features, self.log_ratio) if among is None else (self.features[among],
                                                                             self.log_ratio[among])
        k = min(NEIGHBOURS, len(feats))
        d, idx = cKDTree(feats).query(z, k=k)
        d, idx = d.reshape(len(z), k), idx.reshape(len(z), k)
        w = 1.0 / np.maximum(d, 1e-6) ** 2  # a shape at distance 0 (its own features timed) takes their ratio
        return base * np.exp((w * logs[idx]).sum(axis=1) / w.sum(axis=1))

    def predict(self, shapes: np.ndarray) -> np.ndarray:
        shapes = np.atleast_2d(np.asarray(shapes, dtype=np.float64))
        if not len(shapes):
            return np.zeros(0)
        base = np.maximum(self.base.predict(shapes), 1e-12)
        z = shape_features(self.kernel, shapes)
        out = self._corrected(base, z)
        if self.caches is not None:
            self._past_caches(shapes, z, base, out)
        return out

    def _past_caches(self, shapes: np.ndarray, z: np.ndarray, base: np.ndarray, out: np.ndarray) -> None:
        """Memory-bound shapes larger than every timed one (in flops or bytes): the correction of the timed
        shapes in their cache regime; with none timed there, of those in the highest regime below it, and a
        shape beyond the last cache then takes at least its memory floor (:meth:`CacheRegimes.memory_seconds`;
        in place)."""
        c = self.caches
        rows = (z[:, :2] > self.features[:, :2].max(axis=0)).any(axis=1) & c.memory_bound(self.kernel, shapes)
        if not rows.any():
            return
        timed = c.regime(self.working_set)
        at = c.regime(working_set(self.kernel, shapes))
        for r in np.unique(at[rows]):
            sel = rows & (at == r)
            below = timed[timed <= r]
            if not len(below):
                continue  # every timed shape in a higher regime: nothing to prefer
            among = timed == below.max()
            out[sel] = self._corrected(base[sel], z[sel], among)
            if below.max() < r == c.memory:
                n = len(all_kernels()[self.kernel].params)
                floor = c.memory_seconds(shape_bytes(self.kernel, shapes[sel, n:]),
                                         working_set(self.kernel, shapes[sel]))
                out[sel] = np.maximum(out[sel], floor)

    def beyond(self, shapes: np.ndarray) -> np.ndarray:
        """Decades each shape lies beyond the timed range in flops or bytes (0 inside it)."""
        return beyond_decades(self.features, shape_features(self.kernel, shapes))

    def describe(self) -> dict:
        return self.base.describe()


@dataclass
class LaneFirstModel:
    """Shapes inside the range of the lane-timed points (:func:`lane_points`) from the model fitted on those,
    the others from the model fitted on every point (see the module's docstring)."""

    inner: ShapeModel
    outer: ShapeModel

    @classmethod
    def fit(cls, kernel_id: int, shapes, seconds, lane_shapes, lane_seconds, base=None,
            caches: CacheRegimes | None = None):
        """The two models, or the model of every point alone where fewer than :data:`MIN_FIT_POINTS` shapes
        are lane-timed or the two sets of points are the same (a shape also learned from a probe's trace has
        the probe's figure in every point's set, its lane figure in the other: not the same)."""
        outer = ShapeModel.fit(kernel_id, shapes, seconds, base=base, caches=caches)
        if len(lane_seconds) < MIN_FIT_POINTS or (np.array_equal(lane_shapes, shapes)
                                                  and np.array_equal(lane_seconds, seconds)):
            return outer
        return cls(ShapeModel.fit(kernel_id, lane_shapes, lane_seconds, caches=caches), outer)

    def predict(self, shapes: np.ndarray) -> np.ndarray:
        shapes = np.atleast_2d(np.asarray(shapes, dtype=np.float64))
        out = self.outer.predict(shapes)
        inside = self.inner.beyond(shapes) <= 0.0
        if inside.any():
            out[inside] = self.inner.predict(shapes[inside])
        return out

    def beyond(self, shapes: np.ndarray) -> np.ndarray:
        return self.outer.beyond(shapes)

    def describe(self) -> dict:
        return self.outer.describe()


def beyond_decades(timed: np.ndarray, features: np.ndarray) -> np.ndarray:
    """Decades each row of ``features`` lies outside the range of ``timed`` (features of
    :func:`shape_features`) in flops or bytes, the larger of the two; 0 inside the range."""
    features = np.atleast_2d(features)
    if not len(timed):
        return np.full(len(features), np.inf)
    lo, hi = timed[:, :2].min(axis=0), timed[:, :2].max(axis=0)
    return np.maximum(np.maximum(features[:, :2] - hi, lo - features[:, :2]), 0.0).max(axis=1)


@dataclass
class RooflineBase:
    """A worker kind's roofline as the physical model of a kernel with too few timed shapes to fit one."""

    kernel: int
    kind: object  # WorkerKind

    def predict(self, shapes: np.ndarray) -> np.ndarray:
        n_params = len(all_kernels()[self.kernel].params)
        return self.kind.roofline(shape_flops(self.kernel, shapes[:, :n_params]),
                                  shape_bytes(self.kernel, shapes[:, n_params:]))

    def describe(self) -> dict:
        return {"fixed_us": float("nan"), "gflops": float("nan"), "GBps": float("nan")}


def interior(features: np.ndarray) -> np.ndarray:
    """Rows that are not at the smallest or largest flops or bytes of the set (the range's ends)."""
    ends = np.zeros(len(features), dtype=bool)
    for j in range(2):
        lo, hi = features[:, j].min(), features[:, j].max()
        if lo < hi:  # a kernel without flops has no range in them
            ends |= (features[:, j] == lo) | (features[:, j] == hi)
    return ~ends


def holdout_errors(calibration, holdout: float = 0.3, seed: int = 0, kernels=None, lane: str = "cold") -> dict:
    """Per kernel, the shape model's relative error on timed shapes left out of its fit.

    The timed shapes inside the range (not an end of flops or bytes: shapes
    never timed lie inside the timed range, since calibration times the
    ends) are split at random into ``round(1 / holdout)`` folds, shapes of
    equal features together; each fold is predicted by the model fitted on
    every other shape, so each is held out once and each fit keeps about
    ``1 - holdout`` of them. ``lane``: the cold or the hot lane times
    (:meth:`tilecast.perfmodel.calibration.Calibration.arrays`). Kernels with fewer than :data:`MIN_FIT_POINTS`
    shapes left to fit are left out.

    Returns ``{kernel: {"n_fit", "n_heldout", "median_rel_err", "max_rel_err", "base_median_rel_err",
    "fit"}}``: ``n_fit`` timed shapes, ``n_heldout`` of them predicted while held out, the median and
    largest relative error of those predictions, the median error of the physical fit alone (without
    the neighbours), and the physical fit over all shapes (fixed_us, gflops, GBps).
    """
    rng = np.random.default_rng(seed)
    folds = max(2, int(round(1.0 / holdout)))
    out = {}
    for name in sorted(kernels if kernels is not None else calibration.points):
        shapes, t = lane_points(calibration, name, lane=lane)
        if len(t) < MIN_FIT_POINTS + 1:
            shapes, t = calibration.arrays(name, lane=lane)
        if len(t) < MIN_FIT_POINTS + 1:
            continue
        k = get(name)
        z = shape_features(k.id, shapes)
        keys, group = np.unique(z, axis=0, return_inverse=True)
        group = group.ravel()
        inner = np.unique(group[interior(z)])
        if not len(inner):
            continue
        fold_of = np.full(len(keys), -1)
        fold_of[rng.permutation(inner)] = np.arange(len(inner)) % folds
        pred, base = np.full(len(t), np.nan), np.full(len(t), np.nan)
        for f in range(folds):
            test = fold_of[group] == f
            if not test.any() or (~test).sum() < MIN_FIT_POINTS:
                continue
            model = ShapeModel.fit(k.id, shapes[~test], t[~test])
            pred[test] = model.predict(shapes[test])
            base[test] = model.base.predict(shapes[test])
        done = np.isfinite(pred)
        if not done.any():
            continue
        err = np.abs(pred[done] - t[done]) / t[done]
        out[name] = {"n_fit": int(len(t)), "n_heldout": int(done.sum()), "median_rel_err": float(np.median(err)),
                     "max_rel_err": float(err.max()),
                     "base_median_rel_err": float(np.median(np.abs(base[done] - t[done]) / t[done])),
                     "fit": ShapeModel.fit(k.id, shapes, t).describe()}
    return out


EXTRAPOLATION_HOLDOUT = 2  # the largest timed sizes of a kernel predicted, each from the smaller shapes alone


def extrapolation_errors(calibration, kernels=None, lane: str = "cold", largest: int = EXTRAPOLATION_HOLDOUT,
                         caches: CacheRegimes | None = None) -> dict:
    """Per kernel, the shape model's relative error when it extrapolates: each of the ``largest`` greatest
    sizes among the timed shapes (flops, or bytes for a kernel without flops; shapes of that size together)
    is predicted by the model fitted on the shapes smaller than it alone, the largest first. ``caches``: the
    machine's cache regimes, as the duration model uses them (:func:`tilecast.perfmodel.cache_regimes.machine_regimes`).

    Returns ``{kernel: {"n_fit", "n_heldout", "median_rel_err", "max_rel_err", "decades"}}``: the timed
    shapes, those predicted while held out, the median and largest relative error of those predictions,
    and the farthest (in decades of flops or bytes) that one of them lay beyond the shapes it was
    predicted from. Kernels with fewer than :data:`MIN_FIT_POINTS` shapes below their largest are left out.
    """
    out = {}
    for name in sorted(kernels if kernels is not None else calibration.points):
        shapes, t = calibration.arrays(name, lane=lane)
        if len(t) < MIN_FIT_POINTS + 1:
            continue
        k = get(name)
        z = shape_features(k.id, shapes)
        col = 0 if z[:, 0].max() > z[:, 0].min() else 1
        size = z[:, col]
        errs, far = [], 0.0
        for s in np.unique(size)[::-1][:largest]:
            test, fit = size == s, size < s
            if fit.sum() < MIN_FIT_POINTS:
                break
            model = ShapeModel.fit(k.id, shapes[fit], t[fit], caches=caches)
            errs += list(np.abs(model.predict(shapes[test]) - t[test]) / t[test])
            far = max(far, float(model.beyond(shapes[test]).max()))
        if errs:
            out[name] = {"n_fit": int(len(t)), "n_heldout": len(errs), "median_rel_err": float(np.median(errs)),
                         "max_rel_err": float(np.max(errs)), "decades": far}
    return out
