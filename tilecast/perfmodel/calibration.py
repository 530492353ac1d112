"""Calibration: time real kernels over a grid of tile shapes, store per machine, reuse.

Each shape is run ``repeats`` times after a warm-up; the median is kept with
the median absolute deviation (robust to other jobs sharing the
cores). Results go to a versioned JSON file named after the machine and its
fingerprint, under ``$TILECAST_HOME/calibration`` (default
``~/.cache/tilecast/calibration``); a file whose fingerprint or format differs
is not reused.
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass, field

import numpy as np

from tilecast.atomic_file import atomic_write
from tilecast.home import home
from tilecast.kernels import all_kernels, get
from tilecast.perfmodel.timers import default_timer, make_buffers

# 2: shapes are timed as StarPU tasks where StarPU runs (source starpu-tasks); stores of format 1 hold
# shapes timed alone, which made first predictions 20-30% fast, and are calibrated again
# 3: a sample of shapes is also timed on one worker (worker_samples): steps on fewer workers than calibration
# kept busy run their kernels faster
# 4: shapes timed as StarPU tasks are timed hot too (``hot``: each chain's repeats back to back) beside the
# cold lanes of ``points`` (chains of many shapes interleaved), with the core's cache size (``cache_bytes``): a
# task's duration is interpolated between them by the reuse distance of its bytes (tilecast.perfmodel.reuse)
# 5: the one-worker sample (worker_samples) is timed hot on one worker and on all, side by side; format 4 set it
# cold on one worker against the main cold passes, which measured the lanes' cache state as much as the workers
# (every one-worker step of the accuracy suite predicted 4-16% fast)
# 6: shapes timed as StarPU tasks are also timed cold within the shared last-level cache (``near``: chains
# interleaved in graphs of a few MiB) beside the cold lanes of ``points`` (graphs of up to 512 MiB, which reach
# main memory), with that cache's share per core (``llc_bytes``): a task's bytes last touched within that share
# take the near figure (tilecast.perfmodel.reuse; on the 2-core Xeon a step's tiles evicted from the core's
# level-2 cache mostly came back from the shared cache, and the one cold figure predicted its steps 12% slow)
CALIBRATION_FORMAT = 6


class CalibrationError(ValueError):
    """A calibration file that cannot be used."""


TRACE = "trace"  # the source of points learned from the runtime's own traces
STARPU_TASKS = "starpu-tasks"  # the source of points timed as StarPU tasks by calibration
PROBE_TRACE = "probe-trace"  # the source of points learned from the traces of calibration's own probe steps
STARPU_HISTORY = "starpu-history"  # the source of points read from StarPU's history files (of earlier runs)
IN_RUNTIME = (TRACE, STARPU_HISTORY, STARPU_TASKS, PROBE_TRACE)  # measured inside the runtime (not scaled)
# Sources learned from runs of the configurations a user ran (not from calibration): a forecast "on first use"
# predicts without them (:meth:`Calibration.calibrated_only`); where a shape has both, they take precedence.
LEARNED = (TRACE, STARPU_HISTORY)


def source_rank(source: str) -> int:
    """Precedence of a point's source when a shape has several: learned from runs, then the probes' traces,
    then timed as StarPU tasks, then timed alone."""
    return 3 if source in LEARNED else 2 if source == PROBE_TRACE else 1 if source == STARPU_TASKS else 0


@dataclass
class Calibration:
    """Measured points: per kernel name, shapes (params + buffer bytes), median seconds and where
    each was measured (``source``: the timer's name, or ``trace`` for a real run's tasks).

    A kernel runs slower inside the runtime than timed alone: its inputs were
    just written by another task, maybe on another core, instead of staying hot
    in this core's caches, and the codelet's call costs a little.
    ``runtime_samples`` holds, per kernel, shapes that were both timed alone
    and traced: ``[bytes, seconds alone, seconds in the runtime]``. Fitted,
    they give :meth:`runtime_excess`, ``fixed + per_byte * min(bytes,
    largest traced bytes)`` (not extrapolated past the largest shape seen,
    where the isolated timing already streams from memory), which
    :meth:`arrays` adds to the points timed alone.
    """

    machine: str
    fingerprint: str
    kind: str
    timer: str
    points: dict = field(default_factory=dict)  # kernel -> {"shapes", "median_s", "mad_s", "source"}: lists
    runtime_samples: dict = field(default_factory=dict)  # kernel -> [[bytes, alone s, in-runtime s], ...]
    lane_workers: int = 0  # busy workers while shapes were timed as StarPU tasks (0: none were)
    worker_samples: dict = field(default_factory=dict)  # kernel -> [[bytes, s on one worker, s on lane_workers]]
    # how quiet the machine was while shapes were timed as StarPU tasks (tilecast.loop.kernel_calibration):
    # passes, passes_disturbed, passes_retaken, reference_best_s, waited_s, lane_figures_again
    quiet: dict = field(default_factory=dict)
    # the C kernels' code the shapes were timed with (tilecast.kernels.native.kernels_fingerprint)
    kernels: str = field(default_factory=lambda: _kernels_fingerprint())
    # kernel -> shapes seen but not timed: calibration of a large set times a chosen subset and leaves these to
    # the shape model (tilecast.perfmodel.shape_model); kept so that they are not timed again
    predicted: dict = field(default_factory=dict)
    # kernel -> {"shapes", "median_s"}: shapes timed as StarPU tasks hot (each chain's repeats back to back; the
    # ``points`` of source starpu-tasks are the same shapes timed cold, interleaved with other shapes' chains)
    hot: dict = field(default_factory=dict)
    # the level-2 cache per core where the shapes were timed (tilecast.perfmodel.cache_size), and its source
    cache_bytes: float = 0.0
    cache_source: str = ""
    # kernel -> {"shapes", "median_s"}: the same shapes timed cold within the shared last-level cache (chains
    # interleaved in graphs of runtime_timer.NEAR_GROUP_BYTES); that cache's share per core and its source
    near: dict = field(default_factory=dict)
    llc_bytes: float = 0.0
    llc_source: str = ""
    # by how much a traced probe step's tasks scale the part of their lane figures that their cache level adds
    # (near or cold minus hot) and their hot figure, and what they add per byte they access
    # (tilecast.loop.step_probe; 1, 1 and 0: as the lanes say), and how the three were measured
    in_step_factor: float = 1.0
    in_step_source: str = ""
    in_step_hot: float = 1.0
    in_step_byte_s: float = 0.0
    # the longest hot figure among the probe's fitted tasks (s): the hot factor scales a task's hot figure up to
    # it and adds no more than it adds there to a longer task's (0: every hot figure scaled whole)
    in_step_hot_span_s: float = 0.0
    # what the latest ensure_calibration timed (not stored): cases, timed, predicted, budget_s, wall_s
    last_run: dict = field(default_factory=dict, compare=False)

    def add_predicted(self, kernel: str, shape) -> None:
        self.predicted.setdefault(kernel, []).append([float(x) for x in shape])

    def add(self, kernel: str, shape, median_s: float, mad_s: float, source: str | None = None,
            workers: int = 0) -> None:
        """A point; ``workers``: the busy workers of the steps it was learned from (0: not tied to a count)."""
        entry = self.points.setdefault(kernel, {"shapes": [], "median_s": [], "mad_s": [], "source": []})
        entry.setdefault("source", [self.timer] * len(entry["shapes"]))
        if workers or "workers" in entry:
            entry.setdefault("workers", [0] * len(entry["shapes"])).append(int(workers))
        entry["shapes"].append([float(x) for x in shape])
        entry["median_s"].append(float(median_s))
        entry["mad_s"].append(float(mad_s))
        entry["source"].append(source or self.timer)

    def add_hot(self, kernel: str, shape, median_s: float) -> None:
        """A shape's hot lane time (a later one for the same shape takes precedence)."""
        entry = self.hot.setdefault(kernel, {"shapes": [], "median_s": []})
        entry["shapes"].append([float(x) for x in shape])
        entry["median_s"].append(float(median_s))

    def add_near(self, kernel: str, shape, median_s: float) -> None:
        """A shape's near lane time, cold within the shared cache (a later one for the same shape takes
        precedence)."""
        entry = self.near.setdefault(kernel, {"shapes": [], "median_s": []})
        entry["shapes"].append([float(x) for x in shape])
        entry["median_s"].append(float(median_s))

    def add_all(self, other: "Calibration") -> None:
        """Add every point of ``other``, each with its source (and its worker samples, hot and near lane times
        and cache sizes)."""
        for name, e in other.hot.items():
            for shape, m in zip(e["shapes"], e["median_s"]):
                self.add_hot(name, shape, m)
        for name, e in other.near.items():
            for shape, m in zip(e["shapes"], e["median_s"]):
                self.add_near(name, shape, m)
        if other.cache_bytes > 0:
            self.cache_bytes, self.cache_source = other.cache_bytes, other.cache_source
        if other.llc_bytes > 0:
            self.llc_bytes, self.llc_source = other.llc_bytes, other.llc_source
        if other.in_step_source:
            self.in_step_factor, self.in_step_source = other.in_step_factor, other.in_step_source
            self.in_step_hot, self.in_step_byte_s = other.in_step_hot, other.in_step_byte_s
            self.in_step_hot_span_s = other.in_step_hot_span_s
        for name, rows in other.worker_samples.items():
            self.worker_samples.setdefault(name, []).extend([list(r) for r in rows])
        self.lane_workers = self.lane_workers or other.lane_workers
        for name, rows in other.predicted.items():
            self.predicted.setdefault(name, []).extend([list(r) for r in rows])
        for name, e in other.points.items():
            for shape, m, d, src, w in zip(e["shapes"], e["median_s"], e["mad_s"], other.sources(name),
                                           other.point_workers(name)):
                self.add(name, shape, m, d, src, w)

    def sources(self, kernel: str) -> list:
        e = self.points.get(kernel) or {}
        return e.get("source") or [self.timer] * len(e.get("shapes", []))

    def point_workers(self, kernel: str) -> list:
        """Per point of ``kernel``, the busy workers of the steps it was learned from (0: not tied to a count)."""
        e = self.points.get(kernel) or {}
        return e.get("workers") or [0] * len(e.get("shapes", []))

    def runtime_excess(self, kernel: str) -> list | None:
        """[fixed s, s per byte, largest bytes] fitted on the kernel's runtime samples, or None."""
        samples = self.runtime_samples.get(kernel)
        return fit_runtime_excess(samples) if samples else None

    def worker_factor(self, kernel: str, nbytes: np.ndarray, workers: int) -> np.ndarray:
        """How much faster (< 1) or slower a shape of ``nbytes`` runs with ``workers`` busy than with the
        :attr:`lane_workers` that calibration kept busy: 1 without samples or for as many workers.

        From ``worker_samples`` (shapes timed hot on one worker and on all,
        side by side: :func:`tilecast.loop.kernel_calibration.worker_pair_passes`):
        the median ratio of their times over the kernel's samples, clipped to
        [0.5, 1.5], scaled linearly between one worker and ``lane_workers``.
        One figure per kernel, not a curve over sizes. What it stands for is
        contention for what the cores share (memory bandwidth, a shared cache,
        a physical core under two virtual ones), at equal cache state; on the
        2-core Xeon the median over all sampled shapes was 0.97-0.985 (per
        kernel 0.75-1.03; docs/predicting.md).
        """
        nbytes = np.atleast_1d(np.asarray(nbytes, dtype=np.float64))
        rows = self.worker_samples.get(kernel)
        if not rows or self.lane_workers <= 1 or workers >= self.lane_workers:
            return np.ones(len(nbytes))
        a = np.asarray(rows, dtype=np.float64).reshape(-1, 3)
        r = float(np.clip(np.median(a[:, 1] / a[:, 2]), 0.5, 1.5))
        share = (self.lane_workers - max(workers, 1)) / (self.lane_workers - 1)
        return np.full(len(nbytes), 1.0 + (r - 1.0) * share)

    def has_hot(self, kernel: str) -> bool:
        """Does the kernel have hot lane times (then :meth:`arrays` with ``lane="hot"`` differs from cold)?"""
        return bool((self.hot.get(kernel) or {}).get("shapes"))

    def has_near(self, kernel: str) -> bool:
        """Does the kernel have near lane times (then :meth:`arrays` with ``lane="near"`` differs from cold)?"""
        return bool((self.near.get(kernel) or {}).get("shapes"))

    def arrays(self, kernel: str, isolated: bool = False, workers: int | None = None, lane: str = "cold",
               exclude: tuple = ()) -> tuple[np.ndarray, np.ndarray]:
        """Shapes and seconds of a kernel's points, one per shape (of the highest :func:`source_rank`, the
        latest of those; points of the sources in ``exclude`` left out); points timed alone get the kernel's
        runtime excess (unless ``isolated``); with
        ``workers``, the calibration's own in-runtime points (timed as tasks, or on the probe steps, with
        :attr:`lane_workers` busy) get the :meth:`worker_factor` of that many workers.

        ``lane="hot"``: points timed as StarPU tasks take their hot lane time where one was timed; every
        other point (learned from traces, in-step already; timed alone) keeps its one figure, so that the
        interpolation between hot and cold (:mod:`tilecast.perfmodel.reuse`) leaves it as it is. ``lane="near"``
        likewise with the near lane times (cold within the shared cache).

        Points learned from steps on a known number of workers (:meth:`point_workers`): for ``workers``, a
        shape's point learned on that many is taken first; one learned on another count gets the ratio of
        the two counts' :meth:`worker_factor` (a kernel runs at another speed with one core busy than with
        two: on the 2-core machine the in-step sums of three steps were 2-9% higher on two workers than on one)."""
        if lane not in LANES:
            raise ValueError(f"lane: one of {', '.join(LANES)}, got {lane!r}")
        e = self.points.get(kernel)
        if not e:
            return np.zeros((0, 0)), np.zeros(0)
        sources = self.sources(kernel)
        tags = self.point_workers(kernel)

        def order(i):  # source first; among points of one source, those learned on as many workers
            return source_rank(sources[i]), 2 if tags[i] == workers else 1 if not tags[i] else 0

        best: dict = {}
        for i, shape in enumerate(e["shapes"]):
            key = tuple(shape)
            if sources[i] in exclude:
                continue
            if key not in best or order(i) >= order(best[key]):
                best[key] = i
        if not best:
            return np.zeros((0, 0)), np.zeros(0)
        keep = sorted(best.values())
        shapes = np.asarray([e["shapes"][i] for i in keep], dtype=np.float64)
        t = np.asarray([e["median_s"][i] for i in keep], dtype=np.float64)
        kept = np.asarray([sources[i] for i in keep])
        learned_on = np.asarray([tags[i] for i in keep], dtype=np.int64)
        timed = self.hot if lane == "hot" else self.near if lane == "near" else {}
        if (timed.get(kernel) or {}).get("shapes"):
            h = timed[kernel]
            hot = {tuple(s): m for s, m in zip(h["shapes"], h["median_s"])}  # the latest of a shape
            found = np.asarray([hot.get(tuple(s), np.nan) for s in shapes.tolist()], dtype=np.float64)
            t = np.where((kept == STARPU_TASKS) & np.isfinite(found), found, t)
        excess = self.runtime_excess(kernel)
        if excess is not None and not isolated:
            alone = ~np.isin(kept, IN_RUNTIME)
            t = np.where(alone, t + runtime_excess_s(kernel, shapes, excess), t)
        if workers is not None and kernel in self.worker_samples:
            from tilecast.perfmodel.shapes import shape_bytes

            k = get(kernel)
            lanes = np.isin(kept, (STARPU_TASKS, PROBE_TRACE))
            nbytes = shape_bytes(k.id, shapes[:, len(k.params):])
            factor = self.worker_factor(kernel, nbytes, workers)
            t = np.where(lanes, t * factor, t)
            other = (learned_on > 0) & (learned_on != workers)
            for w in np.unique(learned_on[other]):  # learned on another count: from that count's speed to this one's
                at = other & (learned_on == w)
                t = np.where(at, t * factor / self.worker_factor(kernel, nbytes, int(w)), t)
        return shapes, t

    def without_points(self, timer: str | None = None) -> "Calibration":
        """A copy of everything but the points (lane times, caches, samples, quiet record), with ``timer``
        (default: this one's) as the source of points added without one. What learning from runs starts from,
        so that nothing calibration measured beside the points is lost on the way."""
        return Calibration(self.machine, self.fingerprint, self.kind, timer or self.timer,
                           runtime_samples={k: [list(r) for r in v] for k, v in self.runtime_samples.items()},
                           lane_workers=self.lane_workers,
                           worker_samples={k: [list(r) for r in v] for k, v in self.worker_samples.items()},
                           quiet=dict(self.quiet), kernels=self.kernels,
                           predicted={k: [list(r) for r in v] for k, v in self.predicted.items()},
                           hot=_copy_lane(self.hot), cache_bytes=self.cache_bytes, cache_source=self.cache_source,
                           near=_copy_lane(self.near), llc_bytes=self.llc_bytes, llc_source=self.llc_source,
                           in_step_factor=self.in_step_factor, in_step_source=self.in_step_source,
                           in_step_hot=self.in_step_hot, in_step_byte_s=self.in_step_byte_s,
                           in_step_hot_span_s=self.in_step_hot_span_s)

    def calibrated_only(self) -> "Calibration":
        """A copy without the points learned from runs (:data:`LEARNED` sources): what ``tilecast calibrate``
        alone gives, the models a forecast of a configuration that never ran is made from."""
        out = self.without_points()
        for name in self.points:
            e = self.points[name]
            for shape, m, d, src, w in zip(e["shapes"], e["median_s"], e["mad_s"], self.sources(name),
                                           self.point_workers(name)):
                if src not in LEARNED:
                    out.add(name, shape, m, d, src, w)
        return out

    # --- files ---------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": CALIBRATION_FORMAT, "machine": self.machine, "fingerprint": self.fingerprint,
                "kind": self.kind, "timer": self.timer,
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "points": self.points, "runtime_samples": self.runtime_samples, "lane_workers": self.lane_workers,
                "worker_samples": self.worker_samples, "quiet": self.quiet, "kernels": self.kernels,
                "predicted": self.predicted, "hot": self.hot, "cache_bytes": self.cache_bytes,
                "cache_source": self.cache_source, "near": self.near, "llc_bytes": self.llc_bytes,
                "llc_source": self.llc_source, "in_step_factor": self.in_step_factor,
                "in_step_hot": self.in_step_hot, "in_step_byte_s": self.in_step_byte_s,
                "in_step_hot_span_s": self.in_step_hot_span_s, "in_step_part": IN_STEP_PART,
                "in_step_source": self.in_step_source}

    def save(self, path: str | None = None) -> str:
        path = path or calibration_path(self.machine, self.fingerprint)
        with atomic_write(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
        return path

    @classmethod
    def load(cls, path: str, fingerprint: str | None = None) -> "Calibration":
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise CalibrationError(f"{path}: cannot read calibration ({e})") from None
        if doc.get("format") != CALIBRATION_FORMAT:
            raise CalibrationError(f"{path}: calibration format {doc.get('format')!r}, not {CALIBRATION_FORMAT} (which "
                                   "times each shape hot, cold within the shared cache and cold beyond it): run "
                                   "`tilecast calibrate` again")
        if fingerprint is not None and doc.get("fingerprint") != fingerprint:
            raise CalibrationError(f"{path}: made on another machine (fingerprint {doc.get('fingerprint')})")
        known = {k.name: k for k in all_kernels()}
        for name, e in doc.get("points", {}).items():
            if name not in known:
                raise CalibrationError(f"{path}: field points.{name}: unknown kernel")
            width = len(known[name].params) + len(known[name].buffers)
            if any(len(s) != width for s in e["shapes"]) or not (len(e["shapes"]) == len(e["median_s"])):
                raise CalibrationError(f"{path}: field points.{name}: shapes must have {width} numbers each")
            if any(not (t > 0 and np.isfinite(t)) for t in e["median_s"]):
                raise CalibrationError(f"{path}: field points.{name}.median_s: must be positive seconds")
            if "source" in e and len(e["source"]) != len(e["shapes"]):
                raise CalibrationError(f"{path}: field points.{name}.source: one per shape")
            if "workers" in e and (len(e["workers"]) != len(e["shapes"]) or not all(
                    isinstance(w, int) and not isinstance(w, bool) and w >= 0 for w in e["workers"])):
                raise CalibrationError(f"{path}: field points.{name}.workers: one count (>= 0) per shape")
        samples = doc.get("runtime_samples") or {}
        for name, rows in samples.items():
            if name not in known or not all(isinstance(r, list) and len(r) == 3 and all(
                    isinstance(v, (int, float)) and v > 0 and np.isfinite(v) for v in r) for r in rows):
                raise CalibrationError(f"{path}: field runtime_samples.{name}: a known kernel, rows of three "
                                       "positive numbers")
        workers = doc.get("worker_samples") or {}
        for name, rows in workers.items():
            if name not in known or not all(isinstance(r, list) and len(r) == 3 and all(
                    isinstance(v, (int, float)) and v > 0 and np.isfinite(v) for v in r) for r in rows):
                raise CalibrationError(f"{path}: field worker_samples.{name}: a known kernel, rows of three "
                                       "positive numbers")
        lane_workers = doc.get("lane_workers", 0)
        if not isinstance(lane_workers, int) or lane_workers < 0:
            raise CalibrationError(f"{path}: field lane_workers: a count of workers, got {lane_workers!r}")
        quiet = doc.get("quiet") or {}
        if not isinstance(quiet, dict):
            raise CalibrationError(f"{path}: field quiet: a mapping, got {quiet!r}")
        predicted = doc.get("predicted") or {}
        for name, rows in predicted.items():
            width = len(known[name].params) + len(known[name].buffers) if name in known else -1
            if width < 0 or not all(isinstance(r, list) and len(r) == width for r in rows):
                raise CalibrationError(f"{path}: field predicted.{name}: a known kernel, shapes of {width} numbers")
        hot, near = _lane_times(path, doc, "hot", known), _lane_times(path, doc, "near", known)
        cache, llc = _bytes_field(path, doc, "cache_bytes"), _bytes_field(path, doc, "llc_bytes")
        factor, on_hot, per_byte, span = (doc.get("in_step_factor", 1.0), doc.get("in_step_hot", 1.0),
                                          doc.get("in_step_byte_s", 0.0), doc.get("in_step_hot_span_s", 0.0))
        for field_name, v in (("in_step_factor", factor), ("in_step_hot", on_hot), ("in_step_byte_s", per_byte),
                              ("in_step_hot_span_s", span)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v >= 0 and np.isfinite(v)):
                raise CalibrationError(f"{path}: field {field_name}: a non-negative number, got {v!r}")
        in_step_source = str(doc.get("in_step_source", ""))
        if doc.get("in_step_part") != IN_STEP_PART:  # factors of another part of the figure (before): measured again
            factor, on_hot, per_byte, span, in_step_source = 1.0, 1.0, 0.0, 0.0, ""
        return cls(doc["machine"], doc["fingerprint"], doc.get("kind", "cpu"), doc.get("timer", "?"), doc["points"],
                   {k: [list(r) for r in v] for k, v in samples.items()}, lane_workers,
                   {k: [list(r) for r in v] for k, v in workers.items()}, quiet, str(doc.get("kernels", "")),
                   {k: [list(r) for r in v] for k, v in predicted.items()},
                   hot=_copy_lane(hot), cache_bytes=cache, cache_source=str(doc.get("cache_source", "")),
                   near=_copy_lane(near), llc_bytes=llc, llc_source=str(doc.get("llc_source", "")),
                   in_step_factor=float(factor), in_step_source=in_step_source, in_step_hot=float(on_hot),
                   in_step_byte_s=float(per_byte), in_step_hot_span_s=float(span))


LANES = ("cold", "hot", "near")  # Calibration.arrays' lanes
#: what the in-step terms scale: ``in_step_hot`` the hot figure up to ``in_step_hot_span_s``, ``in_step_factor``
#: the cache part of the lane figures, ``in_step_byte_s`` the task's bytes. Files of one factor (on the whole
#: figure before 2026-12-03's accuracy run 37, on the cache part alone before 2026-12-05's run 54) and of three
#: terms without the span (before run 58) load them as 1, 1 and 0, and the probe step runs again
IN_STEP_PART = "hot within the probe's span, cache and bytes"


def _copy_lane(lane: dict) -> dict:
    return {k: {"shapes": [list(r) for r in e["shapes"]], "median_s": list(e["median_s"])} for k, e in lane.items()}


def _lane_times(path: str, doc: dict, key: str, known: dict) -> dict:
    """A calibration file's ``hot`` or ``near`` field, checked: kernel -> {"shapes", "median_s"}."""
    lane = doc.get(key) or {}
    for name, e in lane.items():
        width = len(known[name].params) + len(known[name].buffers) if name in known else -1
        if width < 0 or not isinstance(e, dict) or not all(
                isinstance(r, list) and len(r) == width for r in e.get("shapes", [])) \
                or len(e.get("shapes", [])) != len(e.get("median_s", [])) \
                or not all(isinstance(t, (int, float)) and t > 0 and np.isfinite(t) for t in e["median_s"]):
            raise CalibrationError(f"{path}: field {key}.{name}: a known kernel, shapes of {width} numbers and "
                                   "one positive median_s each")
    return lane


def _bytes_field(path: str, doc: dict, key: str) -> float:
    value = doc.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value >= 0 and np.isfinite(value)):
        raise CalibrationError(f"{path}: field {key}: a number of bytes, got {value!r}")
    return float(value)


def fit_runtime_excess(samples) -> list:
    """[fixed s, s per byte, largest bytes] from [bytes, alone s, in-runtime s] rows: non-negative least
    squares on the relative error of the in-runtime seconds."""
    from scipy.optimize import nnls

    a = np.asarray(samples, dtype=np.float64).reshape(-1, 3)
    x = np.stack([np.ones(len(a)), a[:, 0]], axis=1)
    scale = np.maximum(x.max(axis=0), 1e-300)
    w = 1.0 / a[:, 2]
    c, _ = nnls((x / scale) * w[:, None], (a[:, 2] - a[:, 1]) * w)
    c = c / scale
    return [float(c[0]), float(c[1]), float(a[:, 0].max())]


def runtime_excess_s(kernel: str, shapes: np.ndarray, excess) -> np.ndarray:
    """Extra seconds inside the runtime of shapes of ``kernel``: ``fixed + per_byte * min(bytes, largest)``."""
    from tilecast.perfmodel.shapes import shape_bytes

    k = get(kernel)
    fixed, per_byte, largest = excess
    nbytes = shape_bytes(k.id, np.atleast_2d(shapes)[:, len(k.params):])
    return fixed + per_byte * np.minimum(nbytes, largest)


def calibration_path(machine: str, fingerprint: str) -> str:
    return str(home("calibration", f"{machine}-{fingerprint}.json"))


def stale_calibration(machine) -> str | None:
    """Why the machine's stored calibration cannot be used (one line), or None when there is none or it can."""
    path = calibration_path(machine.name, machine.fingerprint())
    if not os.path.exists(path):
        return None
    try:
        Calibration.load(path, machine.fingerprint())
    except CalibrationError as e:
        return str(e)
    return None


def find_calibration(machine) -> Calibration | None:
    """The stored calibration of a machine, if one was made with the same fingerprint and the same C kernels'
    code (a kernel changed since times differently: its calibration is made again)."""
    path = calibration_path(machine.name, machine.fingerprint())
    if not os.path.exists(path):
        return None
    try:
        cal = Calibration.load(path, machine.fingerprint())
    except CalibrationError:
        return None
    return cal if cal.kernels == _kernels_fingerprint() else None


def _kernels_fingerprint() -> str:
    from tilecast.kernels.native import kernels_fingerprint

    return kernels_fingerprint()


def calibrate(machine, cases, repeats: int = 7, timer=None, timer_name: str | None = None,
              kind: str | None = None, progress=None) -> Calibration:
    """Time every case ``(kernel_name, shape)`` (shape = params then buffer bytes) on ``timer``.

    ``timer`` defaults to the C kernels when built, else the numpy references.
    Returns a :class:`Calibration` (not yet saved).
    """
    if timer is None:
        timer_name, timer = default_timer()
    cal = Calibration(machine.name, machine.fingerprint(), kind or machine.kind_names[0], timer_name or "custom")
    for name, shape in (progress(cases) if progress else cases):
        k = get(name)
        shape = np.asarray(shape, dtype=np.float64)
        params, nbytes = shape[:len(k.params)], shape[len(k.params):]
        bufs = make_buffers(k.id, nbytes)
        t = np.asarray(timer(k.id, params, bufs, repeats), dtype=np.float64)
        med = float(np.median(t))
        cal.add(name, shape, med, float(np.median(np.abs(t - med))))
    return cal


def cases_from_shapes(shapes, per_kernel: int | None = None) -> list[tuple[str, np.ndarray]]:
    """Calibration cases from :func:`tilecast.perfmodel.shapes.graph_shapes`: one per distinct shape.

    With ``per_kernel``, at most that many per kernel, spread evenly over the
    kernel's shapes sorted by bytes then flops (many shapes differ only in an
    offset parameter that does not change the cost).
    """
    from tilecast.perfmodel.shapes import shape_bytes, shape_flops

    ks = all_kernels()
    merged: dict[int, list] = {}
    for s in shapes:
        merged.setdefault(s.kernel, []).append(s.shapes)
    out = []
    for kid, mats in merged.items():
        rows = np.unique(np.concatenate(mats), axis=0)
        n_params = len(ks[kid].params)
        if per_kernel is not None and len(rows) > per_kernel:
            order = np.lexsort((shape_flops(kid, rows[:, :n_params]), shape_bytes(kid, rows[:, n_params:])))
            rows = rows[order[np.unique(np.linspace(0, len(rows) - 1, per_kernel).round().astype(int))]]
        out += [(ks[kid].name, row) for row in rows]
    return out


def gemm_cases(sizes, trans=((0, 0),)) -> list[tuple[str, np.ndarray]]:
    """GEMM cases over a grid of (m, n, k) sizes: the core of any tiling's cost."""
    out = []
    for m in sizes:
        for n in sizes:
            for kk in sizes:
                for ta, tb in trans:
                    out.append(("gemm", np.array([ta, tb, m, n, kk, 1.0, 1.0, 4 * m * kk, 4 * kk * n, 4 * m * n],
                                                 dtype=np.float64)))
    return out
