"""Kernel calibration on first use: time the step's tile shapes that the machine's store lacks.

The first ``tilecast tune`` (or ``accuracy``, ``demo``) on a computer times
every distinct task shape of the candidate graphs and adds them to the
perfmodel's calibration store (``$TILECAST_HOME/calibration``); later runs
find them there and time only shapes they have not seen. Where StarPU runs,
shapes are timed as StarPU tasks with every worker busy
(:mod:`tilecast.executor.runtime_timer`, source ``starpu-tasks``), since that is
how a step runs them and they run slower there than alone; elsewhere, and for
shapes StarPU cannot run, the C kernels are timed alone on one BLAS thread.
Long shapes are repeated fewer times so that first use stays quick.

A large set of shapes (the candidate tilings of a GPT-2-small-width step hold
thousands) is not timed whole: when the estimated time to time every shape
exceeds the budget (:data:`BUDGET_S`), a design of each kernel's shapes is
timed (:mod:`tilecast.perfmodel.calibration_design`) and the others are left
to the shape model (:mod:`tilecast.perfmodel.shape_model`), whose error on
timed shapes held out of its fit is printed. Small sets (the accuracy
suite's, a tiny model's) are timed whole, as before.

Whatever the budget, a shape whose task is estimated longer than
:data:`~tilecast.perfmodel.calibration_design.MAX_TASK_S` or whose buffers
would fill more than a share of the memory available (a cluster-size model's
tiles of hundreds of MB) is not timed (:func:`bounded_cases`): the shape model
extrapolates it from the kernel's largest timed shapes, and the error of that
extrapolation on the largest timed shapes is printed in a one-line note.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from tilecast.kernels import get
from tilecast.perfmodel.calibration import (STARPU_TASKS, Calibration, calibrate, cases_from_shapes,
                                           find_calibration)
from tilecast.perfmodel.calibration_design import MAX_TASK_S, MEMORY_SHARE, choose_timed, over_bound
from tilecast.perfmodel.shape_model import extrapolation_errors, holdout_errors, shape_features
from tilecast.perfmodel.shapes import graph_shapes, shape_bytes, shape_flops
from tilecast.perfmodel.timers import default_timer

TARGET_S = 0.05  # seconds of timing per shape, at most MAX_REPEATS runs, at least one
MAX_REPEATS = 7
# As StarPU tasks, per lane: short tasks vary 10-40% from one chain of 7 to the next (VM speed spells,
# the runtime around them), so they get up to 40 runs; each costs its duration plus a few microseconds.
STARPU_REPEATS = (4, 40)
# Passes over all the shapes, a shape's figure the median of its passes: the VM's slow spells (seconds
# long) then move a shape's figure only when they cover most passes.
STARPU_PASSES = 3
# The same shapes timed hot too (tilecast.executor.runtime_timer): under prio, each chain's repeats back to back.
# One pass: back-to-back repeats vary less than interleaved ones, and a fourth pass keeps a first calibration
# near 10 minutes on 2 cores. The passes above (under eager, chains interleaved) give the cold figure.
HOT_SCHED, COLD_SCHED = "prio", "eager"
HOT_PASSES = 1
# And cold within the shared last-level cache (the near figure: chains interleaved in graphs of
# runtime_timer.NEAR_LANE_BYTES a lane, under eager): one pass, as the hot figure.
NEAR_PASSES = 1
QUIET_WAIT_S = 60.0  # the most a calibration waits, in all, for a slow spell of the machine to pass
# Shapes per kernel also timed on one worker (spread over their sizes): how much faster a kernel runs when
# the other cores are idle (Calibration.worker_factor), for steps on fewer workers than calibration used.
WORKER_SAMPLES_PER_KERNEL = 8
# Hot passes of that sample on one worker and as many on every worker, alternated (worker_pair_passes).
WORKER_PASSES = 2
# A task estimated longer than this is timed twice per lane and pass (a warm-up and one timed run, as
# StarPU's profiling of a long task varies little) and left out of the one-worker sample.
LONG_TASK_S = 0.1
# The largest timed shapes of a kernel whose ratio to the roofline scales its estimates (task_seconds).
RATE_FROM = 3
# Estimated seconds of timing (all passes) above which a design of each kernel's shapes is timed instead of
# every shape: about 6 minutes on 2 cores, which with the probes keeps a first calibration near 10 minutes.
BUDGET_S = 360.0
# The estimate of a shape's timing cost: per task at least TASK_FLOOR_S (StarPU's own cost per task and
# its profiling), per shape and pass SHAPE_SETUP_S (graph, handles, trace), and its buffers filled per lane.
TASK_FLOOR_S = 20e-6
SHAPE_SETUP_S = 2e-3
FILL_S_PER_BYTE = 2e-9


def known_shapes(cal: Calibration | None) -> set:
    """(kernel, shape) pairs the calibration has timed or left to the shape model."""
    if cal is None:
        return set()
    return ({(name, tuple(float(x) for x in s)) for name, e in cal.points.items() for s in e["shapes"]}
            | {(name, tuple(float(x) for x in s)) for name, rows in cal.predicted.items() for s in rows})


def missing_cases(cal: Calibration | None, graphs) -> list:
    """Calibration cases (kernel name, shape) of ``graphs`` (task graphs, or their
    :func:`~tilecast.perfmodel.shapes.graph_shapes` lists) that ``cal`` does not hold."""
    have = known_shapes(cal)
    shapes = [ks for g in graphs for ks in (g if isinstance(g, list) else graph_shapes(g))]
    if not shapes:
        return []
    out, seen = [], set()
    for name, row in cases_from_shapes(shapes):
        key = (name, tuple(float(x) for x in row))
        if key not in have and key not in seen:
            seen.add(key)
            out.append((name, row))
    return out


def estimated_seconds(machine, cases) -> np.ndarray:
    """Roofline estimate of each case's duration (to choose how often to repeat it)."""
    wk = machine.kinds[machine.kind_names[0]]
    out = np.zeros(len(cases))
    for i, (name, row) in enumerate(cases):
        k = get(name)
        p, b = row[None, :len(k.params)], row[None, len(k.params):]
        out[i] = wk.roofline(shape_flops(k.id, p), shape_bytes(k.id, b))[0]
    return out


def task_seconds(machine, cal: Calibration | None, cases) -> np.ndarray:
    """Estimated seconds of one task of each case: the roofline (:func:`estimated_seconds`), scaled per kernel
    by how much longer than it ``cal``'s :data:`RATE_FROM` largest timed shapes of the kernel ran (not below 1:
    the roofline's peak is a best case)."""
    est = estimated_seconds(machine, cases)
    if cal is None:
        return est
    wk = machine.kinds[machine.kind_names[0]]
    scale = {}
    for name in {name for name, _ in cases}:
        shapes, t = cal.arrays(name) if name in cal.points else (np.zeros((0, 0)), np.zeros(0))
        if not len(t):
            continue
        k = get(name)
        z = shape_features(k.id, shapes)
        top = np.lexsort((z[:, 1], z[:, 0]))[::-1][:RATE_FROM]
        roof = wk.roofline(shape_flops(k.id, shapes[top, :len(k.params)]),
                           shape_bytes(k.id, shapes[top, len(k.params):]))
        scale[name] = max(1.0, float(np.median(t[top] / np.maximum(roof, 1e-12))))
    return est * np.asarray([scale.get(name, 1.0) for name, _ in cases])


def buffer_bytes(cases, lanes: int) -> np.ndarray:
    """Bytes of each case's buffers on ``lanes`` lanes (what timing it allocates)."""
    return np.asarray([float(np.sum(np.asarray(row, dtype=np.float64)[len(get(name).params):]))
                       for name, row in cases]) * max(lanes, 1)


def bounded_cases(machine, cal: Calibration | None, cases, lanes: int, available_bytes: float | None = None
                  ) -> tuple[np.ndarray, dict]:
    """(a flag per case over the bound: never to be timed, the bound as a dict ``max_task_s``, ``max_bytes``):
    a task estimated longer than :data:`~tilecast.perfmodel.calibration_design.MAX_TASK_S`
    (:func:`task_seconds`), or buffers on ``lanes`` lanes over
    :data:`~tilecast.perfmodel.calibration_design.MEMORY_SHARE` of ``available_bytes`` (default: the memory
    available now)."""
    if available_bytes is None:
        from tilecast.graph.size_estimate import available_memory

        available_bytes = available_memory()
    over = over_bound(task_seconds(machine, cal, cases), buffer_bytes(cases, lanes), available_bytes)
    return over, {"max_task_s": MAX_TASK_S, "max_bytes": MEMORY_SHARE * float(available_bytes)}


def with_past_cache(machine, cal: Calibration | None, cases, over, timed, known, lanes: int, est, cost, costs):
    """(timed, cases, est, cost) with what :func:`tilecast.perfmodel.calibration_design.past_cache` adds for a
    memory-bound kernel with no timed shape beyond the last-level cache: a case of ``cases`` moved to the timed,
    or a new case appended (timed, if it is under the bound itself). ``costs(cases)``: (est, cost) of new cases."""
    from tilecast.perfmodel.cache_regimes import machine_regimes
    from tilecast.perfmodel.calibration_design import past_cache

    caches = machine_regimes(machine.kinds[machine.kind_names[0]], cal, lanes=lanes)
    add, made = past_cache(cases, over, timed, caches, known)
    if made:
        made_over, _ = bounded_cases(machine, cal, made, lanes)
        made = [c for c, o in zip(made, made_over) if not o]
    timed = list(timed) + [i for i in add if i not in timed]
    if made:
        e, c = costs(made)
        timed += list(range(len(cases), len(cases) + len(made)))
        cases, est, cost = list(cases) + made, np.concatenate([est, e]), np.concatenate([cost, c])
    return timed, cases, est, cost


def extrapolation_summary(cal: Calibration, over_cases, machine=None) -> dict:
    """What the shape model extrapolates for ``over_cases`` (shapes over the bound): per kernel, the shapes
    (``n``), the farthest one beyond the timed range (``decades`` of flops or bytes; None: nothing of the kernel
    timed, its shapes get the roofline), and the model's measured error extrapolating to the largest timed shapes
    (:func:`tilecast.perfmodel.shape_model.extrapolation_errors`: ``heldout``, None where too few are timed),
    with ``machine``'s cache regimes as the duration model uses them."""
    from tilecast.perfmodel.cache_regimes import machine_regimes
    from tilecast.perfmodel.shape_model import beyond_decades

    by_kernel: dict = {}
    for name, row in over_cases:
        by_kernel.setdefault(name, []).append(row)
    caches = machine_regimes(machine.kinds[cal.kind], cal) if machine is not None and cal.kind in machine.kinds \
        else None
    errors = extrapolation_errors(cal, kernels=[n for n in by_kernel if n in cal.points], caches=caches)
    out = {}
    for name, rows in sorted(by_kernel.items()):
        k = get(name)
        timed = cal.arrays(name)[0] if name in cal.points else np.zeros((0, 0))
        far = beyond_decades(shape_features(k.id, timed) if len(timed) else np.zeros((0, 2)),
                             shape_features(k.id, np.asarray(rows, dtype=np.float64)))
        out[name] = {"n": len(rows), "decades": float(far.max()) if np.isfinite(far.max()) else None,
                     "heldout": errors.get(name)}
    return out


def extrapolation_note(run: dict) -> str:
    """One line: how many shapes were over the bound and the error of extrapolating to the largest timed."""
    ex = run.get("extrapolated") or {}
    n = sum(r["n"] for r in ex.values())
    errs = [r["heldout"] for r in ex.values() if r["heldout"]]
    bound = run.get("bound", {})
    what = (f"{n} kernel shapes of {len(ex)} kernels over the timing bound (a task over "
            f"{bound.get('max_task_s', MAX_TASK_S):g} s or buffers over {bound.get('max_bytes', 0) / 2**30:.1f} GiB) "
            f"were not timed but extrapolated from the largest timed shapes")
    far = [r["decades"] for r in ex.values() if r["decades"] is not None]
    if far:
        what += f", up to {max(far):.1f} decades of flops or bytes beyond them"
    if len(far) < len(ex):
        what += f" ({len(ex) - len(far)} kernels with no shape timed: the roofline)"
    if errs:
        med = float(np.median([e["median_rel_err"] for e in errs]))
        worst = max(e["max_rel_err"] for e in errs)
        what += (f"; the largest timed shapes predicted from the smaller ones "
                 f"({max(e['decades'] for e in errs):.1f} decades beyond at most): "
                 f"median error {100 * med:.0f}%, at most {100 * worst:.0f}%")
    return "note: " + what


def starpu_repeats(est: np.ndarray) -> np.ndarray:
    """Tasks per lane and pass for shapes of estimated seconds ``est`` (:data:`STARPU_REPEATS`, and 2 for
    shapes longer than :data:`LONG_TASK_S`)."""
    reps = np.clip(np.round(TARGET_S / np.maximum(est, 1e-9)), *STARPU_REPEATS).astype(int)
    return np.where(np.asarray(est) > LONG_TASK_S, 2, reps)


def timing_cost_s(cases, est: np.ndarray, repeats: np.ndarray, lanes: int, passes: int) -> np.ndarray:
    """Estimated wall seconds to time each case: ``passes`` times its tasks (lanes side by side), its
    set-up, and filling its buffers on every lane."""
    nbytes = np.asarray([float(np.sum(np.asarray(row, dtype=np.float64)[len(get(name).params):]))
                         for name, row in cases])
    return passes * (np.asarray(repeats) * np.maximum(est, TASK_FLOOR_S) + SHAPE_SETUP_S
                     + FILL_S_PER_BYTE * nbytes * max(lanes, 1))


def starpu_workers(machine) -> int | None:
    """Workers to time shapes on inside StarPU (the machine's, at most StarPU's limit), or None without StarPU."""
    try:
        from tilecast.executor.starpu_session import max_workers

        return min(len(machine.workers), max_workers())
    except Exception:  # no StarPU library or no compiler: isolated timing only
        return None


def time_in_starpu(machine, cal: Calibration | None, cases, repeats, workers: int, bar=None, guard=None,
                   record: list | None = None):
    """Time ``cases`` as StarPU tasks on ``workers`` busy workers and add them to ``cal`` (made if None).

    Each pass runs in a StarPU session of its own between two reference steps
    (``guard``, a :class:`tilecast.loop.interference.QuietGuard`; by default
    one that waits at most :data:`QUIET_WAIT_S` in all): a pass that a slow
    spell of the machine disturbed is retaken, so that the calibration does
    not learn the spell's slowness. How the passes fared is kept in
    ``cal.quiet``, with the median reference step around them
    (``reference_s``: the machine's speed while the kernels were timed).
    With a ``record`` list, the passes (a :class:`StarPUTiming`) are appended
    to it, so that a caller whose guard later sees a faster reference can
    take the passes it then finds disturbed again (:mod:`tilecast.loop.quiet_calibration`).

    Each case is timed cold (:data:`STARPU_PASSES` passes under ``eager``, its
    figure the calibration's point), hot (:data:`HOT_PASSES` under
    ``prio``, ``cal.hot``) and cold within the shared cache
    (:data:`NEAR_PASSES` under ``eager`` in small graphs, ``cal.near``); the
    cache size a task's inputs stay hot within, and the shared cache's share
    per core (sysfs's, or less where a stream on every core at once shows less:
    :mod:`tilecast.perfmodel.llc_probe`), are stored beside them (``cal.cache_bytes``, ``cal.llc_bytes``). With several workers, a
    sample of the cases is also timed hot on one worker and on all, side by
    side (:func:`worker_pair_passes`, ``cal.worker_samples``). A hot or near figure that stands out from the
    same kernel's shapes of about its size (a spell inside that lane's one pass) is timed again and the lesser
    of the two kept (:meth:`StarPUTiming.plan_again`; how many in ``cal.quiet["lane_figures_again"]``).

    Returns (calibration, the cases StarPU could not run)."""
    from tilecast.executor.runtime_timer import runnable
    from tilecast.loop.interference import QuietGuard
    from tilecast.perfmodel.cache_size import l2_per_core
    from tilecast.perfmodel.llc_probe import effective_llc_per_core

    if cal is None:
        cal = Calibration(machine.name, machine.fingerprint(), machine.kind_names[0], STARPU_TASKS)
    guard = guard if guard is not None else QuietGuard(workers=workers, max_wait_s=QUIET_WAIT_S)
    l2, l2_source = l2_per_core()
    cal.cache_bytes, cal.cache_source = float(l2), l2_source
    llc, llc_source = effective_llc_per_core(l2, workers)  # sysfs's share, or less where a stream shows less
    cal.llc_bytes, cal.llc_source = float(llc), llc_source
    sample = worker_sample(cases, estimated_seconds(machine, cases)) if workers > 1 else []
    # the bar counts whole cases: a pass over n of them advances it by n / per_case
    per_case = (len(cases) * (STARPU_PASSES + HOT_PASSES + NEAR_PASSES) + len(sample) * 2 * WORKER_PASSES
                ) / max(len(cases), 1)
    done = [0.0]  # cases timed so far, in fractions of a case per pass and phase

    def advance(n):  # the bar shows whole cases, never past its total
        whole = int(done[0] + 1e-9)
        done[0] += n
        step = int(done[0] + 1e-9) - whole  # 1e-9: thirds that add up to a whole count as one
        if step > 0:
            bar.update(min(step, bar.total - bar.n) if bar.total else step)

    timing = StarPUTiming(list(cases), np.maximum(np.asarray(repeats), 2), workers, sample)
    timing.step = (lambda n: advance(n / per_case)) if bar is not None else None
    for p in timing.plan():
        p.take(guard)
    timing.step = None  # a later retake advances no bar
    for p in timing.plan_again():  # hot and near figures that stand out from their neighbours' (lane_outliers)
        p.take(guard)
    timing.apply(cal)
    judged = [guard.verdict(p.info) for p in timing.passes]
    summary = guard.summary()
    before = cal.quiet or {}
    cal.quiet = {"passes": len(judged) + before.get("passes", 0),
                 "passes_disturbed": sum(v["disturbed"] for v in judged) + before.get("passes_disturbed", 0),
                 "passes_retaken": sum(p.info["retakes"] for p in timing.passes) + before.get("passes_retaken", 0),
                 "reference_best_s": summary["reference_best_s"], "waited_s": summary["waited_s"],
                 "reference_s": timing.reference_s,
                 "lane_figures_again": (sum(len(idx) for _, idx, _ in timing.again)
                                        + before.get("lane_figures_again", 0))}
    if record is not None:
        record.append(timing)
    return cal, [c for c in cases if not runnable(*c)]


class StarPUTiming:
    """The passes of one :func:`time_in_starpu`, each a :class:`tilecast.loop.interference.GuardedPass` that can
    be taken again; :meth:`apply` sets the calibration's figures from them (again, after a retake)."""

    def __init__(self, cases, repeats, workers: int, sample: list):
        self.cases, self.repeats, self.workers, self.sample = cases, repeats, workers, sample
        self.step = None  # progress callback of the passes (time_in_runtime's)
        self.cold, self.hot, self.near, self.ones, self.alls = [], [], [], [], []
        self.again: list = []  # (lane, case indices, pass): lane figures timed again (plan_again)
        self._sample_rows: dict = {}  # case index -> the worker sample row last written

    @property
    def passes(self) -> list:
        return self.cold + self.hot + self.near + self.ones + self.alls + [p for *_, p in self.again]

    @property
    def reference_s(self) -> float | None:
        from tilecast.loop.interference import reference_of

        return reference_of(self.passes)

    def _pass(self, what: str, n_workers: int, todo, reps, sched: str, near: bool = False):
        from tilecast.loop.interference import GuardedPass

        def one():
            from tilecast.executor.runtime_timer import MAX_GROUP_BYTES, NEAR_LANE_BYTES, time_in_runtime
            from tilecast.executor.starpu_session import StarPUSession

            group = NEAR_LANE_BYTES * n_workers if near else MAX_GROUP_BYTES
            with StarPUSession(sched, n_workers) as session:
                return time_in_runtime(todo, reps, session, progress=self.step, group_bytes=group)[0]

        return GuardedPass(f"kernels {what} ({sched}, {n_workers} worker{'s' if n_workers > 1 else ''})", one)

    def plan(self) -> list:
        """Every pass, in the order they are taken: cold, hot, near, then the worker pairs (one worker, all,
        ...)."""
        w, cases, reps = self.workers, self.cases, self.repeats
        self.cold = [self._pass(f"cold {i + 1}/{STARPU_PASSES}", w, cases, reps, COLD_SCHED)
                     for i in range(STARPU_PASSES)]
        self.hot = [self._pass(f"hot {i + 1}/{HOT_PASSES}", w, cases, reps, HOT_SCHED) for i in range(HOT_PASSES)]
        self.near = [self._pass(f"near {i + 1}/{NEAR_PASSES}", w, cases, reps, COLD_SCHED, near=True)
                     for i in range(NEAR_PASSES)]
        order = list(self.cold + self.hot + self.near)
        if self.sample:
            def planned(n_workers, todo, r, step, sched, count):  # worker_pair_passes' order, taken later
                made = [self._pass(f"sample on {n_workers}", n_workers, todo, r, sched) for _ in range(count)]
                (self.ones if n_workers == 1 else self.alls).extend(made)
                order.extend(made)
                return [np.zeros(len(todo))] * count

            worker_pair_passes(planned, w, [cases[i] for i in self.sample], reps[self.sample])
        return order

    def _lanes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(cold median, its MAD, hot, near) of every case from the passes taken, each lane's figures timed
        again (:meth:`plan_again`) at the lesser of their two times."""
        med, mad = _median_mad([p.result for p in self.cold])
        hot, _ = _median_mad([p.result for p in self.hot])
        near, _ = _median_mad([p.result for p in self.near]) if self.near else (np.full(len(med), np.nan), None)
        lanes = {"hot": hot, "near": near}
        for lane, idx, p in self.again:
            if p.result is not None:
                lanes[lane][idx] = np.fmin(lanes[lane][idx], np.asarray(p.result, dtype=np.float64))
        return med, mad, hot, near

    def plan_again(self) -> list:
        """Passes that time again, in their lane, the cases whose hot or near figure stands out from the same
        kernel's neighbours (:func:`tilecast.perfmodel.lane_outliers.outlying`); :meth:`apply` keeps the
        lesser of the two figures. Called once the planned passes are taken; none when nothing stands out."""
        from tilecast.perfmodel.lane_outliers import outlying

        cold, _, hot, near = self._lanes()
        made = []
        for lane, times, sched in (("hot", hot, HOT_SCHED), ("near", near, COLD_SCHED)):
            idx = np.asarray(outlying(self.cases, cold, times), dtype=np.int64)
            if len(idx):
                p = self._pass(f"{lane} again ({len(idx)} shapes)", self.workers, [self.cases[i] for i in idx],
                               self.repeats[idx], sched, near=lane == "near")
                self.again.append((lane, idx, p))
                made.append(p)
        return made

    def apply(self, cal: Calibration) -> None:
        """Set ``cal``'s points, hot and near lane times and worker samples of these cases from the passes'
        results (replacing those an earlier apply set)."""
        med, mad, hot, near = self._lanes()
        at = _starpu_points(cal)
        for (name, row), m, d, h, c in zip(self.cases, med, mad, hot, near):
            if np.isfinite(m):
                _set_point(cal, at, name, row, max(float(m), 1e-9), float(d))
                if np.isfinite(h):
                    _set_lane(cal.hot, cal.add_hot, name, row, max(float(h), 1e-9))
                if np.isfinite(c):
                    _set_lane(cal.near, cal.add_near, name, row, max(float(c), 1e-9))
        cal.lane_workers = self.workers
        if not self.sample:
            return
        one, busy = _median_mad([p.result for p in self.ones])[0], _median_mad([p.result for p in self.alls])[0]
        for i, t1, tw in zip(self.sample, one, busy):
            name, row = self.cases[i]
            if np.isfinite(t1) and np.isfinite(tw) and t1 > 0 and tw > 0:
                k = get(name)
                nbytes = float(shape_bytes(k.id, np.asarray(row, dtype=np.float64)[None, len(k.params):])[0])
                rows = cal.worker_samples.setdefault(name, [])
                new, old = [nbytes, float(t1), float(tw)], self._sample_rows.get(i)
                if old is not None and old in rows:
                    rows[rows.index(old)] = new
                else:
                    rows.append(new)
                self._sample_rows[i] = new


def _starpu_points(cal: Calibration) -> dict:
    """(kernel, shape) -> index of its latest point timed as StarPU tasks in ``cal``."""
    out = {}
    for name, e in cal.points.items():
        for j, (shape, src) in enumerate(zip(e["shapes"], cal.sources(name))):
            if src == STARPU_TASKS:
                out[(name, tuple(float(x) for x in shape))] = j
    return out


def _set_point(cal: Calibration, at: dict, name: str, row, m: float, d: float) -> None:
    key = (name, tuple(float(x) for x in row))
    if key in at:
        e = cal.points[name]
        e["median_s"][at[key]], e["mad_s"][at[key]] = m, d
    else:
        cal.add(name, row, m, d, STARPU_TASKS)
        at[key] = len(cal.points[name]["shapes"]) - 1


def _set_lane(lane: dict, add, name: str, row, m: float) -> None:
    """A shape's time in one of the calibration's lanes (``cal.hot`` with ``cal.add_hot``, or ``cal.near``):
    its latest entry replaced, or one added."""
    e = lane.get(name)
    shape = [float(x) for x in row]
    if e is not None:
        for j in range(len(e["shapes"]) - 1, -1, -1):
            if e["shapes"][j] == shape:
                e["median_s"][j] = m
                return
    add(name, row, m)


def worker_pair_passes(passes, workers: int, cases, repeats, step=None) -> tuple[np.ndarray, np.ndarray]:
    """(median seconds on one worker, on ``workers``) of each of ``cases``, timed hot (:data:`HOT_SCHED`: each
    chain's repeats back to back): :data:`WORKER_PASSES` passes on each, alternated (one worker, then all, then
    one again...), over the same calibration graphs.

    ``passes(n_workers, cases, repeats, step, sched, count)`` times passes (:meth:`StarPUTiming.plan` has it
    plan them, to be taken under the quiet check and retaken later). Hot,
    a shape's inputs are in its core's cache whatever else its graph holds and however many lanes run, so
    the ratio of the two figures is what the other workers being busy costs a kernel, and nothing else.
    Cold lanes cannot give it: their inputs come from beyond the core's cache, from a larger share of the
    shared cache the fewer bytes the graph holds, and a graph timed on one worker holds one lane per shape
    where it holds one per worker on all of them (measured on the 2-core Xeon: shapes of gpt2-tiny 0.73x on
    one worker cold, 0.985x hot, in the same graphs; docs/predicting.md)."""
    ones, alls = [], []
    for _ in range(WORKER_PASSES):
        ones += passes(1, cases, repeats, step, HOT_SCHED, 1)
        alls += passes(workers, cases, repeats, step, HOT_SCHED, 1)
    return _median_mad(ones)[0], _median_mad(alls)[0]


def _median_mad(runs) -> tuple[np.ndarray, np.ndarray]:
    runs = np.asarray(runs)
    med = np.median(runs, axis=0)
    return med, np.median(np.abs(runs - med), axis=0)


def worker_sample(cases, est=None) -> list:
    """Indices of cases to time on one worker too: per kernel, up to :data:`WORKER_SAMPLES_PER_KERNEL` shapes
    spread evenly over its sizes (smallest and largest included), among those StarPU can run (and, with
    ``est``, estimated at most :data:`LONG_TASK_S`)."""
    from tilecast.executor.runtime_timer import runnable

    by_kernel: dict = {}
    for i, (name, row) in enumerate(cases):
        if runnable(name, row) and (est is None or est[i] <= LONG_TASK_S):
            k = get(name)
            nbytes = float(shape_bytes(k.id, np.asarray(row, dtype=np.float64)[None, len(k.params):])[0])
            by_kernel.setdefault(name, []).append((nbytes, i))
    out = []
    for items in by_kernel.values():
        items.sort()
        n = min(WORKER_SAMPLES_PER_KERNEL, len(items))
        out += [items[j][1] for j in np.unique(np.round(np.linspace(0, len(items) - 1, n)).astype(int))]
    return sorted(out)


def ensure_calibration(machine, graphs, progress: bool = True, timer=None, in_runtime: bool | None = None,
                       budget_s: float | None = BUDGET_S, guard=None, record: list | None = None) -> Calibration:
    """The machine's stored calibration, extended with every shape of ``graphs`` it lacks (then saved).

    ``machine`` must be the machine as stored (e.g. ``load_machine('local')``, all
    workers): calibrations are keyed by its fingerprint. ``in_runtime`` (default:
    when StarPU runs here and no ``timer`` is given) times shapes as StarPU tasks,
    the step probe's among them, and then runs that probe step to fit how much
    longer than their lanes a step's tasks run (:mod:`tilecast.loop.step_probe`).
    When timing every missing shape is estimated to take more than ``budget_s``
    seconds (None: no limit), a design of each kernel's shapes is timed and the
    others are recorded as predicted by the shape model (``cal.predicted``);
    what was done is in ``cal.last_run``. ``guard`` and ``record``: as
    :func:`time_in_starpu` takes them (a caller's quiet check; the passes kept).
    """
    start = time.monotonic()
    cal = find_calibration(machine)
    starpu = in_runtime or (in_runtime is None and timer is None)
    probe_new = False  # the probe's shapes timed now: the probe step runs again (else its factor stands)
    if starpu:  # the step probe's shapes too: its tasks are compared with their own lanes (step_probe)
        from tilecast.loop.step_probe import probe_graph

        probe = probe_graph()
        probe_new = bool(missing_cases(cal, [probe]))
        graphs = [*graphs, probe]
    todo = missing_cases(cal, graphs)
    if not todo:
        return cal
    workers = starpu_workers(machine) if starpu else None

    def costs(cases):
        est = estimated_seconds(machine, cases)
        if workers:
            return est, timing_cost_s(cases, est, starpu_repeats(est), workers, STARPU_PASSES + HOT_PASSES)
        return est, timing_cost_s(cases, est, np.clip(np.round(TARGET_S / np.maximum(est, 1e-9)), 1, MAX_REPEATS)
                                  + 1, 1, 1)

    est, cost = costs(todo)
    known = {name: cal.arrays(name)[0] for name in cal.points} if cal is not None else None
    over, bound = bounded_cases(machine, cal, todo, workers or 1)
    timed, left = choose_timed(todo, cost, budget_s, known, over=over)
    over_cases = [todo[i] for i in np.flatnonzero(over)]
    timed, todo, est, cost = with_past_cache(machine, cal, todo, over, timed, known, workers or 1, est, cost, costs)
    predicted = [todo[i] for i in sorted(set(left) - set(timed))]
    todo, est = [todo[i] for i in sorted(timed)], est[sorted(timed)]
    repeats = np.clip(np.round(TARGET_S / np.maximum(est, 1e-9)), 1, MAX_REPEATS).astype(int)
    if timer is None:
        timer_name, timer = default_timer()
    else:
        timer_name = "custom"
    bar = None
    if progress:
        from tqdm import tqdm

        desc = "calibrating kernels" + (f" (StarPU tasks, {workers} workers)" if workers else "")
        if predicted:
            desc += f", {len(todo)} of {len(todo) + len(predicted)} shapes"
        bar = tqdm(total=len(todo), unit="shape", desc=desc, file=sys.stderr, leave=False)
    try:
        if workers and todo:
            cal, todo = time_in_starpu(machine, cal, todo, starpu_repeats(est), workers, bar, guard=guard,
                                       record=record)
            cal.save()  # kept even if the isolated timing below is interrupted
            est = estimated_seconds(machine, todo)
            repeats = np.clip(np.round(TARGET_S / np.maximum(est, 1e-9)), 1, MAX_REPEATS).astype(int)
        for r in sorted(set(repeats.tolist())):
            group = [c for c, rr in zip(todo, repeats) if rr == r]

            def counted(items):
                for item in items:
                    yield item
                    if bar is not None:
                        bar.update(1)

            new = calibrate(machine, group, repeats=int(r), timer=timer, timer_name=timer_name, progress=counted)
            if cal is None:
                cal = new
            else:
                cal.add_all(new)
    finally:
        if bar is not None:
            bar.close()
    if cal is None:  # every shape over the bound: none timed
        cal = Calibration(machine.name, machine.fingerprint(), machine.kind_names[0],
                          STARPU_TASKS if workers else timer_name)
    if workers and cal.hot and (probe_new or not cal.in_step_source):  # tilecast.loop.step_probe
        from tilecast.loop.step_probe import in_step_line, take_step_probe

        take_step_probe(machine, cal, guard)
        if progress:
            print(in_step_line(cal), file=sys.stderr)
    for name, row in predicted:
        cal.add_predicted(name, row)
    cal.last_run = {"cases": len(timed) + len(predicted), "timed": len(timed), "predicted": len(predicted),
                    "budget_s": budget_s, "estimated_s": float(np.sum(cost[timed])),
                    "wall_s": time.monotonic() - start, "over_bound": len(over_cases), "bound": bound}
    if over_cases:
        cal.last_run["extrapolated"] = extrapolation_summary(cal, over_cases, machine)
    if predicted:
        kernels = sorted({name for name, _ in predicted})
        cal.last_run["heldout"] = holdout_errors(cal, kernels=kernels)
        if cal.hot:
            cal.last_run["heldout_hot"] = holdout_errors(cal, kernels=[k for k in kernels if cal.has_hot(k)],
                                                         lane="hot")
        if progress:
            print(design_summary(cal.last_run), file=sys.stderr)
            if over_cases:
                print(extrapolation_note(cal.last_run), file=sys.stderr)
    cal.save()
    return cal


def design_summary(run: dict) -> str:
    """What a budgeted calibration timed and the shape model's held-out error per kernel, for people."""
    budget = "no budget" if run["budget_s"] is None else f"budget {run['budget_s']:.0f} s"
    lines = [f"timed {run['timed']} of {run['cases']} kernel shapes in {run['wall_s']:.0f} s ({budget}); the other "
             f"{run['predicted']} are predicted by the shape model, whose error on timed shapes held out of its fit is:",
             f"  {'kernel':<16}{'timed':>7}{'held out':>10}{'median err':>12}{'max err':>10}{'fit alone':>11}"]
    for name, r in run.get("heldout", {}).items():
        lines.append(f"  {name:<16}{r['n_fit']:>7}{r['n_heldout']:>10}{100 * r['median_rel_err']:>11.1f}%"
                     f"{100 * r['max_rel_err']:>9.1f}%{100 * r['base_median_rel_err']:>10.1f}%")
    if run.get("heldout_hot"):
        lines.append("  the same for the hot lane times (each shape's repeats back to back):")
        for name, r in run["heldout_hot"].items():
            lines.append(f"  {name:<16}{r['n_fit']:>7}{r['n_heldout']:>10}{100 * r['median_rel_err']:>11.1f}%"
                         f"{100 * r['max_rel_err']:>9.1f}%{100 * r['base_median_rel_err']:>10.1f}%")
    return "\n".join(lines)
