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
"""

from __future__ import annotations

import sys

import numpy as np

from tilecast.kernels import get
from tilecast.perfmodel.calibration import (STARPU_TASKS, Calibration, calibrate, cases_from_shapes,
                                           find_calibration)
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
QUIET_WAIT_S = 60.0  # the most a calibration waits, in all, for a slow spell of the machine to pass
# Shapes per kernel also timed on one worker (spread over their sizes): how much faster a kernel runs when
# the other cores are idle (Calibration.worker_factor), for steps on fewer workers than calibration used.
WORKER_SAMPLES_PER_KERNEL = 8


def known_shapes(cal: Calibration | None) -> set:
    if cal is None:
        return set()
    return {(name, tuple(float(x) for x in s)) for name, e in cal.points.items() for s in e["shapes"]}


def missing_cases(cal: Calibration | None, graphs) -> list:
    """Calibration cases (kernel name, shape) of ``graphs`` that ``cal`` does not hold."""
    have = known_shapes(cal)
    shapes = [ks for g in graphs for ks in graph_shapes(g)]
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


def starpu_workers(machine) -> int | None:
    """Workers to time shapes on inside StarPU (the machine's, at most StarPU's limit), or None without StarPU."""
    try:
        from tilecast.executor.starpu_session import max_workers

        return min(len(machine.workers), max_workers())
    except Exception:  # no StarPU library or no compiler: isolated timing only
        return None


def time_in_starpu(machine, cal: Calibration | None, cases, repeats, workers: int, bar=None, guard=None):
    """Time ``cases`` as StarPU tasks on ``workers`` busy workers and add them to ``cal`` (made if None).

    Each pass runs in a StarPU session of its own between two reference steps
    (``guard``, a :class:`tilecast.loop.interference.QuietGuard`; by default
    one that waits at most :data:`QUIET_WAIT_S` in all): a pass that a slow
    spell of the machine disturbed is retaken, so that the calibration does
    not learn the spell's slowness. How the passes fared is kept in
    ``cal.quiet``.

    Returns (calibration, the cases StarPU could not run)."""
    from tilecast.executor.runtime_timer import runnable, time_in_runtime
    from tilecast.executor.starpu_session import StarPUSession
    from tilecast.loop.interference import QuietGuard

    if cal is None:
        cal = Calibration(machine.name, machine.fingerprint(), machine.kind_names[0], STARPU_TASKS)
    guard = guard if guard is not None else QuietGuard(workers=workers, max_wait_s=QUIET_WAIT_S)
    sample = worker_sample(cases) if workers > 1 else []
    share = len(cases) / (len(cases) + len(sample))
    verdicts = []

    done = [0.0]  # cases timed so far, in fractions of a case per pass and phase

    def advance(n):  # the bar shows whole cases, never past its total
        whole = int(done[0] + 1e-9)
        done[0] += n
        step = int(done[0] + 1e-9) - whole  # 1e-9: thirds that add up to a whole count as one
        if step > 0:
            bar.update(min(step, bar.total - bar.n) if bar.total else step)

    def passes(n_workers, todo, reps, step):
        def one():
            with StarPUSession("eager", n_workers) as session:
                return time_in_runtime(todo, reps, session, progress=step)[0]

        out = []
        for _ in range(STARPU_PASSES):
            run, info = guard.measure(one)
            out.append(run)
            verdicts.append(info)
        return out

    step = (lambda n: advance(n * share / STARPU_PASSES)) if bar is not None else None
    repeats = np.maximum(np.asarray(repeats), 2)
    med, mad = _median_mad(passes(workers, cases, repeats, step))
    for (name, row), m, d in zip(cases, med, mad):
        if np.isfinite(m):
            cal.add(name, row, max(float(m), 1e-9), float(d), STARPU_TASKS)
    cal.lane_workers = workers
    if sample:
        step = (lambda n: advance(n * (1 - share) * len(cases) / len(sample) / STARPU_PASSES)) \
            if bar is not None else None
        one, _ = _median_mad(passes(1, [cases[i] for i in sample], repeats[sample], step))
        for i, t1 in zip(sample, one):
            name, row = cases[i]
            if np.isfinite(t1) and np.isfinite(med[i]) and t1 > 0 and med[i] > 0:
                k = get(name)
                nbytes = float(shape_bytes(k.id, np.asarray(row, dtype=np.float64)[None, len(k.params):])[0])
                cal.worker_samples.setdefault(name, []).append([nbytes, float(t1), float(med[i])])
    judged = [guard.verdict(v) for v in verdicts]
    summary = guard.summary()
    cal.quiet = {"passes": len(judged) + (cal.quiet or {}).get("passes", 0),
                 "passes_disturbed": sum(v["disturbed"] for v in judged) + (cal.quiet or {}).get("passes_disturbed", 0),
                 "passes_retaken": summary["sessions_retaken"] + (cal.quiet or {}).get("passes_retaken", 0),
                 "reference_best_s": summary["reference_best_s"], "waited_s": summary["waited_s"]}
    return cal, [c for c in cases if not runnable(*c)]


def _median_mad(runs) -> tuple[np.ndarray, np.ndarray]:
    runs = np.asarray(runs)
    med = np.median(runs, axis=0)
    return med, np.median(np.abs(runs - med), axis=0)


def worker_sample(cases) -> list:
    """Indices of cases to time on one worker too: per kernel, up to :data:`WORKER_SAMPLES_PER_KERNEL` shapes
    spread evenly over its sizes (smallest and largest included), among those StarPU can run."""
    from tilecast.executor.runtime_timer import runnable

    by_kernel: dict = {}
    for i, (name, row) in enumerate(cases):
        if runnable(name, row):
            k = get(name)
            nbytes = float(shape_bytes(k.id, np.asarray(row, dtype=np.float64)[None, len(k.params):])[0])
            by_kernel.setdefault(name, []).append((nbytes, i))
    out = []
    for items in by_kernel.values():
        items.sort()
        n = min(WORKER_SAMPLES_PER_KERNEL, len(items))
        out += [items[j][1] for j in np.unique(np.round(np.linspace(0, len(items) - 1, n)).astype(int))]
    return sorted(out)


def ensure_calibration(machine, graphs, progress: bool = True, timer=None, in_runtime: bool | None = None
                       ) -> Calibration:
    """The machine's stored calibration, extended with every shape of ``graphs`` it lacks (then saved).

    ``machine`` must be the machine as stored (e.g. ``load_machine('local')``, all
    workers): calibrations are keyed by its fingerprint. ``in_runtime`` (default:
    when StarPU runs here and no ``timer`` is given) times shapes as StarPU tasks.
    """
    cal = find_calibration(machine)
    todo = missing_cases(cal, graphs)
    if not todo:
        return cal
    est = estimated_seconds(machine, todo)
    repeats = np.clip(np.round(TARGET_S / np.maximum(est, 1e-9)), 1, MAX_REPEATS).astype(int)
    workers = starpu_workers(machine) if (in_runtime or (in_runtime is None and timer is None)) else None
    if timer is None:
        timer_name, timer = default_timer()
    else:
        timer_name = "custom"
    bar = None
    if progress:
        from tqdm import tqdm

        desc = "calibrating kernels" + (f" (StarPU tasks, {workers} workers)" if workers else "")
        bar = tqdm(total=len(todo), unit="shape", desc=desc, file=sys.stderr, leave=False)
    try:
        if workers:
            lane_repeats = np.clip(np.round(TARGET_S / np.maximum(est, 1e-9)), *STARPU_REPEATS).astype(int)
            cal, todo = time_in_starpu(machine, cal, todo, lane_repeats, workers, bar)
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
    cal.save()
    return cal
