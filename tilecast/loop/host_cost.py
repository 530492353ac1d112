"""What a step costs the executor besides its tasks: measured on small probe steps, refined by real runs.

A timed step of ``tilecast run`` is not only its tasks' makespan: the host
loads the next batch, StarPU's tile handles are registered and unregistered,
the loss is read back, and the last task's end is waited for. These costs
are the step's time less the makespan of its tasks in the trace (from the
step's start to the last task's end), measured on real runs of a few small
probe steps (gpt2-tiny, fine tilings: many tiles and tasks, little kernel
time) and fitted as

    host_s = fixed + per_tile * tiles + per_task * tasks

(non-negative least squares on the relative error of the step time, one fit
per worker count). The same traces give the runtime's own cost per task
(:mod:`tilecast.loop.runtime_overhead`), which the simulation charges before
every task. The prediction of a step is its simulated makespan plus
``host_s``. Real runs of other schedulers refine both per scheduler
(:func:`learn_from_runs`). Fits are stored beside the kernel calibration and
reused until the executor's code changes.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from tilecast.atomic_file import atomic_write
from tilecast.home import home
from tilecast.loop.probe_rounds import ROUNDS, median_round, round_key

FORMAT = 32  # 6: dmdasd's decision costs (tilecast.loop.decision_cost), the submitting thread's cost per task;
# 7: the sorted queues' insertion cost (push_walk_s), dmda's probes measured beside dmdas's;
# 8: the cost between tasks per buffer and per successor (gap_*_s), task_overhead_s its constant;
# 9: prio's cost per level of its priority tree (push_walk_s), fitted beside eager;
# 10: the cost of a task started on another worker than the one that made it ready (gap_handoff_s);
# 11: a scheduler's probe fit keeps the worker count's fixed and per-tile host costs (fit_beside), and dmdas's
# cost per task walked past measured on a queue of known length (walk_step_s) bounds the fitted one;
# 12: the cost between tasks' constant gives the probes' mean start delay, none trimmed (fit_gap_model's mean)
# 13: where that constant would go below 0, it is 0 and the costs per buffer and successor shrink to that mean
# 14: dmdasd's cost per queued task read is one for every worker count, fitted on all counts' probes together
# 15: the probes are simulated with the submitting thread's turns on a worker's core where it has none
# (tilecast.simulator.submit_slices), so the costs fitted by simulating them are fitted again
# 16: a sorted policy's walk is kept over its own cost per task only if, fitted on all probes but one, it
# predicts the one left out better (tilecast.loop.decision_cost.fit_sorting)
# 17: the sorted insertion measured with priorities in random order, its steps dearer beyond a knee
# (walk_far_s, walk_knee; tilecast.loop.queue_probe.walk_curve), on one worker for every count
# 18: a cost between tasks per byte of the ended task, up to the core's cache (gap_end_byte_s, gap_byte_cap;
# tilecast.loop.gap_bytes), measured on the step probe
# 19: dmdas's walk also fitted on its longest probe beside dmda, as a step pays it (tilecast.loop.walk_in_step)
# 20: a worker's dmdasd decisions run after its release and earlier insertions, not beside them
# (tilecast.simulator.engine.Engine.decide), so the decision costs fitted by simulating the probes are fitted again
# 21: the submitting thread's cost per task is the probe's with the most tasks (long_submission_per_task), not the
# probes' median
# 22: dmdas's walk as a step pays it fitted on its ratio to dmda on the longest probe in alternated sessions
# (tilecast.loop.walk_pairs)
# 23: dmdasd's cost per queued task read fitted on each worker count's probes alone, as from 6 to 13 (not 14's one cost),
# and the walks and decisions fitted with the cost per byte of the ended task that predictions charge
# 24: eager, prio, ws and lws simulated with a worker popping only once it has released its ended task, an idle one
# taking the released tasks first (tilecast.simulator.policies.base.Policy.pops_after_pushing), so prio's tree
# walk, fitted by simulating its probes, is fitted again
# 25: each scheduler's probes taken in several interleaved sessions, its fits made on the median one
# (tilecast.loop.probe_rounds)
# 26: dmdasd runs with a declared priority range (tilecast.graph.priorities.declared_range): its decisions read one
# sum per worker, so its probes are measured and its decision cost fitted again, per other worker alone
# 27: dmdasd's decision cost fitted on its ratio to dmdas on the longest probe in alternated sessions
# (tilecast.loop.walk_pairs), not on the probes' own sessions
# 28: with a declared priority range dmdasd's decisions cost nothing beyond dmdas's (tilecast.loop.host_cost.
# fit_decisions): no decision cost fitted, no pairs measured
# 29: dmdas's walk fitted on ten alternated pairs, not four (tilecast.loop.walk_pairs.PAIRS)
# 30: the policies whose pushes and pops cost the same take the mean of their probes' costs between tasks
# (POOLED, pool_gap_models), each policy's own kept as own_gap
# 31: eager's fit takes that mean too
# 32: prio's cost per level of its priority tree measured on StarPU on queues of known length
# (tilecast.loop.queue_probe.measure), per worker count, and charged as measured instead of fitted on its probes
# The executor's code the fits describe (executor_files: every Python and C file of tilecast/executor, the
# StarPU glue included, of tilecast/reference, whose tile store and step state the executor moves batches and
# states through, and the trace schema): a change to any of them invalidates stored fits.
EXECUTOR_SUFFIXES = (".py", ".c", ".h")
_PACKAGE = Path(__file__).resolve().parent.parent
PROBES = (("gpt2-tiny", 2, 32, "256"), ("gpt2-tiny", 4, 64, "64"), ("gpt2-tiny", 4, 64, "32"),
          ("gpt2-tiny", 8, 128, "32"), ("gpt2-tiny", 8, 128, "16"))
PROBE_SCHED = "eager"
# Each other scheduler's own cost is measured on the probes with the most tasks per second of step, where
# it shows (dmda decides for every task from the submitting thread: on a 10,074-task step its steps ran
# 20-25% longer than eager's, which eager's probe costs did not foresee).
SCHED_PROBES = PROBES[2:]
SCHED_REPEATS = 5


@dataclass
class HostCost:
    """``fixed + per_tile * tiles + per_task * tasks`` seconds per step, and the runtime's cost per task.

    ``points`` are the fitted runs: [tiles, tasks, median makespan s, median
    step s less that]; ``overheads`` [tasks per second
    of the step, mean start delay s] of the same runs, whose mean weighted by
    the task rate is ``task_overhead_s``: the cost per task matters as much as
    there are tasks in a second of the step, so runs of many short tasks
    decide it (measured here: a mean start delay of 2-5 us on tasks of tens of
    microseconds, 15-20 us on tasks of 15-20 ms, where it costs the step
    nothing in proportion).
    """

    workers: int
    fixed_s: float
    per_tile_s: float
    per_task_s: float
    points: list
    task_overhead_s: float | None = None
    overheads: list = field(default_factory=list)
    probe_points: int = 0  # how many of ``points`` (the first ones) are the probes'
    # what each scheduling decision costs, for the policies that the simulator charges for them
    # (tilecast.loop.decision_cost): per queued task read, per other worker's queue locked
    decision_scan_s: float = 0.0
    decision_lock_s: float = 0.0
    # the submitting thread's seconds per task, measured on the probes with this many workers (0: unknown)
    submit_task_s: float = 0.0
    # dmdas, dmdasd: seconds per queued task that inserting a task into a sorted queue walks past; prio: per
    # level of its priority tree searched on a push or a pop (tilecast.loop.decision_cost.fit_push_walk,
    # tilecast.simulator.queue_costs); 0: not charged
    push_walk_s: float = 0.0
    # dmdas: seconds per task walked past measured on StarPU on queues of known length
    # (tilecast.loop.queue_probe.measure_sorted, walk_curve): over an insertion's first walk_knee steps, the
    # most push_walk_s is fitted to (0: not measured), and beyond them walk_far_s (0: push_walk_s throughout)
    walk_step_s: float = 0.0
    walk_far_s: float = 0.0
    walk_knee: float = 0.0
    # the runtime's cost between a worker's tasks beyond task_overhead_s (tilecast.simulator.gap_cost), fitted
    # on the probes' start delays (tilecast.loop.runtime_overhead.fit_gap_model): seconds per buffer of the
    # starting task, per buffer and per successor of the worker's ended task, per successor it made ready;
    # all 0: not measured
    gap_start_buffer_s: float = 0.0
    gap_end_buffer_s: float = 0.0
    gap_successor_s: float = 0.0
    gap_ready_s: float = 0.0  # per successor the ended task made ready
    gap_handoff_s: float = 0.0  # per task started on another worker than the one that made it ready
    # per byte the worker's ended task accessed, up to gap_byte_cap bytes (tilecast.loop.gap_bytes; 0: not measured)
    gap_end_byte_s: float = 0.0
    gap_byte_cap: float = 0.0
    # task graph (StepConfig.graph_id) -> seconds per task that this scheduler's measured runs of that graph waited
    # between tasks beyond their simulation (tilecast.loop.execute.learn_delay_excess): charged on top of
    # task_overhead_s to that graph alone, as it is a residual of the graph's own learned durations
    graph_excess: dict = field(default_factory=dict)
    # a policy of POOLED: its own probes' cost between tasks, [task_overhead_s, the five gap costs], before
    # pool_gap_models set the pool's mean in their place (empty: not pooled; eager's fit is pooled too)
    own_gap: list = field(default_factory=list)

    def task_overhead_for(self, graph_id: str | None) -> float | None:
        """The constant cost per task charged to a step of ``graph_id``: ``task_overhead_s`` and what that
        graph's own runs taught beyond it (:attr:`graph_excess`), never below 0."""
        if self.task_overhead_s is None:
            return None
        return max(0.0, self.task_overhead_s + self.graph_excess.get(graph_id, 0.0))

    @property
    def gap_costs(self) -> tuple[float, float, float, float, float, float, float]:
        """The costs between tasks in :meth:`tilecast.perfmodel.machine.Machine.with_gap_costs`'s order."""
        return (self.gap_start_buffer_s, self.gap_end_buffer_s, self.gap_successor_s, self.gap_ready_s,
                self.gap_handoff_s, self.gap_end_byte_s, self.gap_byte_cap)

    @property
    def has_gap_model(self) -> bool:
        return any(c > 0.0 for c in self.gap_costs[:6])  # the cap alone is no cost

    @property
    def flat_task_overhead_s(self) -> float | None:
        """The runtime's cost per task as one constant, for a simulation that does not charge it per buffer and
        successor (the rank forecast): the measured steps' mean start delay, weighted by their task rate."""
        o = np.asarray(self.overheads, dtype=np.float64).reshape(-1, 2)
        if not self.has_gap_model or not len(o) or o[:, 0].sum() <= 0:
            return self.task_overhead_s
        return float(np.average(o[:, 1], weights=o[:, 0]))

    def take_gap_model(self, other: "HostCost") -> None:
        """Charge between tasks what ``other`` charges: its constant and its per-buffer and per-successor costs."""
        self.task_overhead_s = other.task_overhead_s
        self.set_gap_costs(other.gap_costs)

    def take_walk(self, other: "HostCost") -> None:
        """Charge the sorted insertions as ``other`` does: its cost per step walked past, and its far steps'."""
        self.push_walk_s, self.walk_far_s, self.walk_knee = other.push_walk_s, other.walk_far_s, other.walk_knee

    def set_gap_costs(self, costs) -> None:
        """Set the costs between tasks from :attr:`gap_costs`' tuple (its first five alone: the cost per byte
        stays)."""
        costs = [float(v) for v in costs]
        (self.gap_start_buffer_s, self.gap_end_buffer_s, self.gap_successor_s, self.gap_ready_s,
         self.gap_handoff_s) = costs[:5]
        if len(costs) > 5:
            self.gap_end_byte_s, self.gap_byte_cap = costs[5:7]

    def fit_gap_model(self, traced) -> None:
        """The cost between tasks fitted on the start delays of ``traced`` = [(graph, real trace)]: its constant
        replaces the mean start delay as ``task_overhead_s``."""
        from tilecast.loop.runtime_overhead import fit_gap_model

        c = fit_gap_model(traced)
        self.task_overhead_s = float(c[0])
        self.set_gap_costs(c[1:])

    @property
    def decides(self) -> bool:
        return self.decision_scan_s > 0.0 or self.decision_lock_s > 0.0

    @property
    def charged_apart(self) -> bool:
        """Are some of this policy's costs per task (decisions, sorted insertions) simulated apart from the
        runtime's cost per task?"""
        return self.decides or self.push_walk_s > 0.0

    def seconds(self, n_tiles: int, n_tasks: int) -> float:
        return self.fixed_s + self.per_tile_s * n_tiles + self.per_task_s * n_tasks

    @classmethod
    def fit(cls, workers: int, points, overheads=()) -> "HostCost":
        from scipy.optimize import nnls  # 0.3 s to import: only where a fit is made

        p = np.asarray(points, dtype=np.float64)
        x = np.stack([np.ones(len(p)), p[:, 0], p[:, 1]], axis=1)
        w = 1.0 / (p[:, 2] + p[:, 3])  # relative error of the step time: small and large steps weigh alike
        scale = x.max(axis=0)
        scale[scale == 0] = 1.0
        c, _ = nnls((x / scale) * w[:, None], p[:, 3] * w)
        c = c / scale
        o = np.asarray(overheads, dtype=np.float64).reshape(-1, 2)
        overhead = float(np.average(o[:, 1], weights=o[:, 0])) if len(o) and o[:, 0].sum() > 0 else None
        return cls(workers, float(c[0]), float(c[1]), float(c[2]), p.tolist(), overhead, o.tolist())


def fit_beside(base: "HostCost | None", workers: int, points, overheads=()) -> HostCost:
    """A scheduler's host cost on its own probe steps (:data:`SCHED_PROBES`), beside the worker count's fit
    ``base`` (eager's, on all of :data:`PROBES`): ``base``'s fixed and per-tile costs (the executor loads the
    batch and registers and unregisters the tiles the same way under every scheduler), and its own cost per
    task, fitted on what is left of its steps' host time (least squares on the relative error, not below 0).

    The scheduler probes are the three with the most tasks (1,214-13,402 tasks, 877-3,849 tiles on
    gpt2-tiny), where the host time is a few percent of the step: three points cannot tell a fixed cost
    from costs per tile and per task. Fitted on them, the fixed cost came out 8-13 ms where the five probes,
    down to 163 tasks, gave eager's 0-2.5 ms; added to a step of 200-800 tasks (15-30 ms), that made prio on
    two workers 53-75% slow in first-use predictions. Without ``base`` (no eager fit stored), the three-term
    fit."""
    if base is None:
        return HostCost.fit(workers, points, overheads)
    out = HostCost.fit(workers, points, overheads)
    p = np.asarray(points, dtype=np.float64).reshape(-1, 4)
    left = p[:, 3] - base.fixed_s - base.per_tile_s * p[:, 0]
    wt = 1.0 / (p[:, 2] + p[:, 3])
    x, y = p[:, 1] * wt, left * wt
    out.fixed_s, out.per_tile_s = float(base.fixed_s), float(base.per_tile_s)
    out.per_task_s = max(float(x @ y / (x @ x)), 0.0) if x @ x > 0 else 0.0
    return out


MAX_POINTS = 60  # a scheduler's own points kept per fit: the most recent runs
MIN_OWN_POINTS = 4  # a scheduler's fit drops the (eager) probe points once it has this many runs of its own


def fit_key(workers: int, sched: str) -> str:
    """Key of a fit learned from real runs of one scheduler (probe fits are keyed by the worker count)."""
    return f"{workers}:{sched}"


def probe_key(workers: int, sched: str) -> str:
    """Key of a scheduler's fit measured on the probes alone (kept when runs refine ``fit_key``'s)."""
    return f"probe:{workers}:{sched}"


def calibrated_only(fits: dict) -> dict:
    """The fits as ``tilecast calibrate`` measured them on the probe steps, without what runs of the user's
    configurations taught: what a forecast of a configuration that never ran is made from.

    The probe fits stay under their own keys too, so that runs learned on top of this view
    (:func:`learn_from_runs`) keep each scheduler's costs between tasks, decisions and sorted insertions
    as the probes measured them: without them a scheduler's learned fit took eager's cost between tasks
    and dropped dmdasd's decisions (in one accuracy run's held-out view, the rows of other policies than eager
    up to 16 points and dmdasd's up to 73 points faster than first use)."""
    out = {k: h for k, h in fits.items() if isinstance(k, int)}
    for k, h in fits.items():
        if isinstance(k, str) and k.startswith("probe:"):
            w, sched = k.split(":")[1:]
            out[k] = h
            out[fit_key(int(w), sched)] = h
    return out


def host_cost_for(fits: dict, workers: int, sched: str):
    """The fit learned for this scheduler and worker count, else the worker count's probe fit, else None."""
    if not fits:
        return None
    return fits.get(fit_key(workers, sched)) or fits.get(workers)


def host_cost_source(fits: dict, workers: int, sched: str) -> str | None:
    """Where :func:`host_cost_for`'s fit comes from, in words; None when there is none."""
    own = fits.get(fit_key(workers, sched)) if fits else None
    if own is not None:
        if own.probe_points >= len(own.points):
            return f"measured on StarPU probe steps run with {sched}"
        return f"learned from measured {sched} steps"
    if fits and workers in fits:
        return "measured on StarPU probe steps"
    return None


def learn_from_runs(fits: dict, runs) -> dict:
    """Fits refined with measured steps.

    ``runs`` = [(workers, sched, tiles, tasks, makespan s, makespan s + host s,
    mean start delay s)] (medians over a configuration's timed steps). A
    scheduler's fit starts from the probe points (run with eager) and keeps
    only its own once it has ``MIN_OWN_POINTS`` of them: dmda's host cost is
    not eager's (it pushes ready tasks with its estimates, for every worker,
    from the submitting thread). Its cost per task is learned from its runs alone.
    """
    out = dict(fits)
    for w, sched in sorted({(r[0], r[1]) for r in runs}):
        mine = [r for r in runs if (r[0], r[1]) == (w, sched)]
        key = fit_key(w, sched)
        old = out.get(key)
        own = (old.points[old.probe_points:] if old is not None else []) + [
            [t, n, mk, max(s - mk, 1e-6)] for _, _, t, n, mk, s, _ in mine]
        own = own[-MAX_POINTS:]
        if probe_key(w, sched) in out:  # its own probe points, else eager's
            base = out[probe_key(w, sched)].points
        elif old is not None and old.probe_points:
            base = old.points[:old.probe_points]
        else:
            base = out[w].points if w in out else []
        probes = base if len(own) < MIN_OWN_POINTS else []
        overheads = (old.overheads if old is not None else []) + [[n / s, o] for _, _, _, n, _, s, o in mine]
        probe = out.get(probe_key(w, sched))
        if probe is None and old is not None and 0 < old.probe_points >= len(old.points):
            probe = old  # a fit measured on this scheduler's probes alone, under its run key
        if probe is not None and probe.charged_apart:
            # a run's start delays include the decisions and sorted insertions, which the simulation charges
            # apart: keep the probe's per-task cost and those costs, and learn the host cost alone
            overheads = probe.overheads
        out[key] = HostCost.fit(w, probes + own, overheads[-MAX_POINTS:])
        out[key].probe_points = len(probes)
        out[key].graph_excess = dict(old.graph_excess) if old is not None else {}  # other graphs' stay
        source = probe or out.get(w) or old  # the submission cost as the probes measured it
        out[key].submit_task_s = source.submit_task_s if source is not None else 0.0
        if probe is not None and probe.charged_apart:
            out[key].task_overhead_s = probe.task_overhead_s
            out[key].decision_scan_s, out[key].decision_lock_s = probe.decision_scan_s, probe.decision_lock_s
            out[key].take_walk(probe)
        if source is not None and source.has_gap_model:
            # a run's mean start delay is the cost between tasks averaged over its own buffers and successors:
            # the probes' model of it is kept, the run teaches the host cost alone
            out[key].take_gap_model(source)
    return out


def executor_files() -> list[str]:
    """The files :func:`executor_fingerprint` hashes, relative to the tilecast package: found, not listed, so a
    file added to the executor cannot be left out."""
    root = _PACKAGE
    found = [p.relative_to(root).as_posix() for package in ("executor", "reference")
             for p in (root / package).rglob("*")
             if p.suffix in EXECUTOR_SUFFIXES and p.is_file() and "__pycache__" not in p.parts]
    return sorted(found) + ["trace.py"]


def executor_fingerprint() -> str:
    import hashlib

    h = hashlib.sha256()
    for name in executor_files():
        h.update(name.encode() + b"\0" + (_PACKAGE / name).read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _path(machine) -> str:
    return str(home("calibration", f"host-{machine.name}-{machine.fingerprint()}.json"))


def load_host_costs(machine) -> dict:
    try:
        with open(_path(machine)) as f:
            doc = json.load(f)
        if doc.get("format") != FORMAT or doc.get("executor") != executor_fingerprint():
            return {}
        return {(k if ":" in k else int(k)): HostCost(**h) for k, h in doc["fits"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def save_host_costs(machine, fits: dict) -> str:
    path = _path(machine)
    with atomic_write(path, "w") as f:
        json.dump({"format": FORMAT, "machine": machine.name, "fingerprint": machine.fingerprint(),
                   "executor": executor_fingerprint(),
                   "fits": {str(w): asdict(h) for w, h in fits.items()}}, f, indent=1)
    return path


def probe_graphs(probes=PROBES) -> list:
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model
    from tilecast.graph.models import build_step

    return [(load_model(name), batch, seq, build_step(load_model(name), batch, seq, Tiling.parse(tile)))
            for name, batch, seq, tile in probes]


def measure_probes(workers: int, probes=PROBES, repeats: int = 15, sched: str = PROBE_SCHED,
                   progress=None) -> tuple[list, list, list, float]:
    """Host-cost points [tiles, tasks, median makespan, median step less median makespan], overhead points
    [tasks per second, mean start delay], the (graph, trace) of real runs of each probe step, and the
    submitting thread's seconds per task (:func:`long_submission_per_task`)."""
    from tilecast.loop.runtime_overhead import task_overhead

    points, overheads, traced, submit = [], [], [], []
    for graph, makespan, host, trace, submit_s in measure_walls(workers, probes, repeats, sched, progress):
        points.append([graph.n_tiles, graph.n_tasks, makespan, max(host, 1e-6)])
        overheads.append([graph.n_tasks / (makespan + host), task_overhead(graph, trace)])
        traced.append((graph, trace))
        submit.append((graph.n_tasks, submit_s))
    return points, overheads, traced, long_submission_per_task(submit)


def long_submission_per_task(submissions: list) -> float:
    """The submitting thread's seconds per task as a long submission pays them: that of the probe with the
    most tasks, from [(tasks, median seconds of its submission)].

    A short submission runs on warm caches: on the 2-core Xeon guest, fresh StarPU sessions, one worker, eager,
    the probes of 163-2,342 tasks (3-26 MB of tiles) took 1.3-1.7 us a task, the one of 13,402 tasks 2.1, and
    the accuracy suite's steps of 1,066-11,397 tasks (54-1,584 MB) 1.8-2.6 (docs/predicting.md, "The
    submitting thread's cost per task"). With as many workers as cores a short submission is also often not
    cut by the scheduler tick (tilecast.simulator.submit_slices), so its wall time per task is about half
    that of a cut one, which the forecast takes as two turns per task: the probes' median (1,214 tasks) gave
    the two-worker figure 1.5 us or 3.0-3.3 us in calibrations minutes apart, the longest probe 4.1-4.2."""
    if not submissions:
        return 0.0
    tasks, seconds = max(submissions, key=lambda s: s[0])
    return float(seconds) / max(int(tasks), 1)


def measure_walls(workers: int, probes=PROBES, repeats: int = 5, sched: str = PROBE_SCHED, progress=None) -> list:
    """[(graph, median makespan s, median step s less the median makespan, trace, median submission s)] of
    training steps of each probe, timed as ``tilecast run`` times them.

    One warm-up step, then ``repeats`` timed steps without building a trace
    (as every step of ``tilecast run`` but the last), then one traced step
    (not timed: building the trace is not part of a step).
    """
    from tilecast.executor.starpu_run import StarPUTraining
    from tilecast.executor.starpu_session import StarPUSession
    from tilecast.reference.step import TrainState, init_params, restore_built_step

    out = []
    with StarPUSession(sched, workers) as session:
        for cfg, batch, seq, graph in probe_graphs(probes):
            data = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(repeats + 2, batch, seq + 1))
            training = StarPUTraining(session, graph, TrainState(init_params(cfg, 0)), data)
            times, makespans, submits = [], [], []
            for _ in range(repeats + 1):
                times.append(training.step(trace=False)[0])
                makespans.append(session.last_makespan_s)
                submits.append(session.last_submit_s)
                if progress:
                    progress()
            trace = training.step(trace=True)[2]
            restore_built_step(graph)  # the calibration learns from the trace
            t, mk = np.asarray(times[1:]), np.asarray(makespans[1:])
            out.append((graph, float(np.median(mk)), float(np.median(t) - np.median(mk)), trace,
                        float(np.median(submits[1:]))))
    return out


def fit_decisions(probe: HostCost, machine, calibration, companion: HostCost | None, sched: str,
                  graphs: list) -> None:
    """Set a deciding policy's probe fit's per-task cost (its companion policy's, measured on the same
    probes; else the machine's) and its decision costs: with a declared priority range
    (:func:`tilecast.graph.priorities.reads_queued_tasks` false, tilecast's default) none; else fitted on the
    measured makespans of the probe ``graphs``.

    Why none: with a range declared, a dmdasd decision reads one running sum per worker where dmdas reads the
    queue's expected length, and each push, pop and start adds to or takes from at most 64 sums
    (``push_task_on_best_worker``, ``_starpu_fifo_task_started``, ``_starpu_fifo_pop_first_ready_task``,
    StarPU 1.3.10): a few additions. A cost per decision fitted on the probes instead took up how far the
    simulator's dmdasd and dmdas decisions differ from the real ones on the probe: fitted on the probes' own
    sessions (host-cost format 26) or on dmdasd's ratio to dmdas in alternated sessions of the longest probe
    (27), 1.9-3.2 us a decision on two workers in five calibrations of the 2-core AMD EPYC guest (accuracy
    runs 91-95), where the simulated ratio with no cost was 0.96 in one calibration and 1.01 in another and
    single pairs' measured ratios spread 0.77-1.49; gpt2-4x128's dmdasd at tile 32 on two workers came out
    +14.5% to +29.6% with the fitted cost and +0.4% to +20.0% with none, the Llama's at tile 96 -4.2% to +10.7%
    and -7.9% to +8.0% (docs/scheduling.md)."""
    from tilecast.graph.priorities import reads_queued_tasks
    from tilecast.loop.decision_cost import fit_decision_cost

    if companion is not None and companion.task_overhead_s is not None:
        probe.take_gap_model(companion)
    if companion is not None:  # its sorted insertions (dmdasd's queues are dmdas's)
        probe.take_walk(companion)
    if not reads_queued_tasks(sched):
        probe.decision_scan_s, probe.decision_lock_s = 0.0, 0.0
        return
    m = _probe_machine(probe, machine)
    makespans = [p[2] for p in probe.points[:probe.probe_points]]
    probe.decision_scan_s, probe.decision_lock_s = fit_decision_cost(m, calibration, graphs, makespans, sched)


def _probe_machine(probe: HostCost, machine):
    """``machine`` with the costs of ``probe`` that a fit keeps fixed, as predict() simulates them."""
    from tilecast.loop.predict import with_submitting_thread

    m = machine.with_task_overhead(probe.task_overhead_s if probe.task_overhead_s is not None
                                   else machine.task_overhead).with_gap_costs(*probe.gap_costs)
    if probe.submit_task_s > 0:
        m = with_submitting_thread(m, machine, len(machine.workers), probe.submit_task_s)
    return m.with_push_walk(probe.push_walk_s).with_walk_far(probe.walk_far_s, probe.walk_knee)


def fit_walks(probe: HostCost, machine, calibration, companion: HostCost | None, sched: str, graphs: list,
              longest_ratio: float | None = None) -> None:
    """Fit a sorted policy's cost per queued task walked past on the measured makespans of the probe
    ``graphs``, its per-task cost then being its companion's (the same policy without sorted queues, measured
    on the same probes), unless its own per-task cost without a walk reproduces the probes better
    (:func:`tilecast.loop.decision_cost.fit_sorting`). ``longest_ratio``: the policy's makespan of the longest
    probe over its companion's, measured in alternated sessions (:mod:`tilecast.loop.walk_pairs`), which the
    walk as a step pays is fitted on instead of the two sessions' ratio."""
    from tilecast.loop.decision_cost import WALKING, fit_sorting
    from tilecast.loop.walk_in_step import far_with, fit_in_step_walk, longest_probe

    own = probe.task_overhead_s
    own_gaps = probe.gap_costs
    if companion is not None and companion.task_overhead_s is not None:
        probe.take_gap_model(companion)
    probe.push_walk_s = 0.0
    m = _probe_machine(probe, machine)
    makespans = [p[2] for p in probe.points[:probe.probe_points]]
    beside = None
    if companion is not None and companion.probe_points == probe.probe_points:  # measured on the same probes
        beside = (WALKING[sched], [p[2] for p in companion.points[:companion.probe_points]])
    probe.push_walk_s, probe.task_overhead_s = fit_sorting(m, calibration, graphs, makespans, sched, beside,
                                                           own if own != probe.task_overhead_s else None,
                                                           cap=probe.walk_step_s)
    if probe.push_walk_s == 0.0 and probe.task_overhead_s == own:  # its own cost between tasks, all of it
        probe.set_gap_costs(own_gaps)
    # the walk as a step pays it, on the longest probe (tilecast.loop.walk_in_step)
    if sched in SORTED_WALK and beside is not None and companion.task_overhead_s is not None:
        if longest_ratio is not None:
            i = longest_probe(graphs)
            makespans = list(makespans)
            makespans[i] = longest_ratio * beside[1][i]
        in_step = fit_in_step_walk(m, calibration, graphs, makespans, sched, beside, floor=probe.walk_step_s)
        if in_step > max(probe.push_walk_s, 1.01 * probe.walk_step_s):  # dearer than the walk on the queue probe
            probe.take_gap_model(companion)
            probe.push_walk_s = in_step
            probe.walk_far_s = far_with(probe.walk_far_s, in_step)


def sched_probe_fit(fits: dict, workers: int, sched: str) -> HostCost | None:
    """``sched``'s fit on the scheduler probes (:data:`SCHED_PROBES`): its own, or for the probe scheduler
    (eager, measured on every probe) the worker count's fit restricted to those probes' points."""
    own = fits.get(probe_key(workers, sched))
    base = fits.get(workers)
    if own is not None or sched != PROBE_SCHED or base is None or len(base.points) < len(PROBES):
        return own
    picked = [base.points[PROBES.index(p)] for p in SCHED_PROBES]
    return replace(base, points=picked, probe_points=len(picked))


def ensure_host_costs(machine, worker_counts, progress: bool = True, scheds=(), guard=None,
                      record: list | None = None) -> dict:
    """Host cost fits for every worker count, and every scheduler of ``scheds``, measured (and stored) for
    those not stored yet.

    The probes' traces also teach the stored kernel calibration (their shapes
    timed first, when missing): their in-runtime durations and each
    kernel's runtime excess (:mod:`tilecast.perfmodel.from_trace`).

    With a ``guard`` (:class:`tilecast.loop.interference.QuietGuard`) each
    StarPU session of probes runs between reference steps and is retaken in
    a slow spell, as the kernel calibration's passes are (given the same
    guard); with a ``record`` list, the sessions (a :class:`ProbeSessions`)
    and the kernel timing's passes are appended to it, to be taken again
    later (:mod:`tilecast.loop.quiet_calibration`).
    """
    from tilecast.loop.kernel_calibration import ensure_calibration

    from tilecast.loop.decision_cost import companions

    fits = load_host_costs(machine)
    todo = [w for w in worker_counts if w not in fits]
    # a deciding or sorting policy's per-task cost is its companion's (the same policy without the decisions'
    # reading or the sorted insertion), measured first
    scheds = list(dict.fromkeys([c for s in scheds for c in companions(s)]))
    sched_todo = [(w, s) for w in worker_counts for s in scheds if s != PROBE_SCHED and probe_key(w, s) not in fits]
    if not todo and not sched_todo:
        return fits
    cal = ensure_calibration(machine, [g for *_, g in probe_graphs()], progress=progress, guard=guard,
                             record=record)
    bar = None
    if progress:
        from tqdm import tqdm

        from tilecast.loop.gap_bytes import SESSIONS as STEP_GAP_SESSIONS
        from tilecast.loop.queue_probe import SIZES as TREE_SIZES
        from tilecast.loop.queue_probe import SORTED_SIZES
        from tilecast.loop.walk_pairs import PAIRS, REPEATS

        sorted_runs = any(s in SORTED_WALK for _, s in sched_todo) * len(SORTED_SIZES) * 10  # 5 x 2 runs a size
        sorted_runs += sum(s in SORTED_WALK for _, s in sched_todo) * PAIRS * 2 * (REPEATS + 1)
        sched_runs = len(sched_todo) * len(SCHED_PROBES) * (SCHED_REPEATS + 1) * ROUNDS
        sched_runs += sum(s in TREE_MEASURED for _, s in sched_todo) * len(TREE_SIZES) * 10  # 5 x 2 runs a size
        bar = tqdm(total=len(todo) * len(PROBES) * 16 + sched_runs + sorted_runs + bool(todo) * STEP_GAP_SESSIONS,
                   desc="measuring the executor's per-step cost", unit="step", file=sys.stderr, leave=False)
    sessions = ProbeSessions(fits, todo, sched_todo, (lambda: bar.update(1)) if bar else None)
    try:
        for p in sessions.passes:
            p.take(guard)
    finally:
        sessions.tick = None  # a later retake advances no bar
        if bar is not None:
            bar.close()
    fits, cal = sessions.fit(machine, cal)
    cal.save()
    save_host_costs(machine, fits)
    if record is not None:
        record.append(sessions)
    return fits


#: policies whose sorted insertion's cost a step is also measured on a queue of known length (and bounds the
#: fitted one): dmdas (dmdasd takes dmdas's walk)
SORTED_WALK = ("dmdas",)

#: policies whose search through their queue is measured on StarPU on queues of known length and charged as
#: measured (tilecast.loop.queue_probe.measure: prio's tree levels), not fitted on their probes
TREE_MEASURED = ("prio",)


def tree_key(workers: int) -> str:
    """ProbeSessions' pass of prio's tree on queues of known length on ``workers`` workers."""
    return f"tree:{workers}"


def set_measured_tree(probe: HostCost, companion: "HostCost | None", level_s: float) -> None:
    """Charge ``probe``'s policy (prio) its tree's search at ``level_s`` seconds a level, as measured on StarPU
    on queues of known length, and between tasks what its companion (eager, the same central queue without
    the tree) charges.

    Fitted on prio's probe steps instead, by simulating them beside eager's, the cost of a level took in
    whatever else set the two policies' probes apart in their sessions: 508 ns a level on two workers in one
    calibration of a 2-core Intel Xeon guest whose slow spells disturbed 49 of its 76 passes, where the
    queues of known length measured 67.5 ns (28 on one worker) minutes later; the suite's prio steps on two
    workers were then forecast 28-30% long (docs/accuracy.md, run 109)."""
    if companion is not None and companion.task_overhead_s is not None:
        probe.take_gap_model(companion)
    probe.push_walk_s = probe.walk_step_s = max(float(level_s), 0.0)


#: the policies whose push and pop cost the same at a given worker count in StarPU 1.3.10
#: (tilecast.simulator.queue_costs.RULES: O(1), O(workers) for random's draw, prio's tree levels charged apart);
#: dm and dmda compute every worker's expected end on each push and are not among them
POOLED = ("eager", "prio", "random", "ws", "lws")


def pool_gap_models(base: "HostCost | None", members: list) -> None:
    """Give ``base`` (eager's fit, on every probe) and each of ``members`` (probe fits of the other
    :data:`POOLED` policies at the same worker count) the mean of their costs between tasks, each keeping its
    own as ``own_gap`` (a fit pooled before is counted by its own).

    Each policy's model is fitted on three probe steps in a few sessions. In one calibration of the AMD EPYC
    guest the five policies' constants came out 358-1,672 ns a task on one worker; one policy's (ws) came out
    797-1,672 ns over six calibrations: as far apart between sessions as between policies. The models are
    linear in their coefficients, so their mean charges each task the mean of their charges."""
    def own(m):
        return list(m.own_gap) if m.own_gap else [m.task_overhead_s, *m.gap_costs[:5]]

    fitted = [m for m in ([base] if base is not None else []) + list(members)
              if m.task_overhead_s is not None and m.has_gap_model]
    if len(fitted) < 2 or not any(m is not base for m in fitted):
        return
    mean = np.array([own(m) for m in fitted]).mean(axis=0)
    for m in fitted:
        m.own_gap = own(m)
        m.task_overhead_s = float(mean[0])
        m.set_gap_costs(mean[1:])


SORTED_KEY = "sorted"  # the sorted-insertion measurement among ProbeSessions' passes (one worker, for every count)
STEP_GAPS_KEY = "step gaps"  # the step probe's traced steps (tilecast.loop.gap_bytes), for every count and policy


def pairs_key(workers: int, sched: str) -> str:
    """ProbeSessions' pass of ``sched`` beside its companion in alternated sessions (tilecast.loop.walk_pairs)."""
    return f"pairs:{workers}:{sched}"


class ProbeSessions:
    """The probe sessions of one :func:`ensure_host_costs` (each a
    :class:`tilecast.loop.interference.GuardedPass`: one StarPU session of probe steps per worker count, and
    per worker count and scheduler), and the fits made from them (:meth:`fit`, again after a retake)."""

    def __init__(self, base: dict, todo: list, sched_todo: list, tick=None):
        from tilecast.loop.decision_cost import WALKING
        from tilecast.loop.gap_bytes import measure_step_gaps
        from tilecast.loop.interference import GuardedPass
        from tilecast.loop.queue_probe import measure as measure_tree
        from tilecast.loop.queue_probe import measure_sorted
        from tilecast.loop.walk_pairs import measure_walk_pairs

        self.base, self.todo, self.sched_todo, self.tick = dict(base), list(todo), list(sched_todo), tick
        self.by_key = {w: GuardedPass(f"executor probes ({w} worker{'s' if w > 1 else ''})",
                                      lambda w=w: measure_probes(w, progress=self._tick)) for w in self.todo}
        for w, sched in self.sched_todo:
            self.by_key[probe_key(w, sched)] = self._sched_pass(w, sched, 0)
            if sched in SORTED_WALK and SORTED_KEY not in self.by_key:
                self.by_key[SORTED_KEY] = GuardedPass(f"sorted insertions ({sched}, 1 worker)",
                                                      lambda: measure_sorted(progress=self._tick))
            if sched in TREE_MEASURED:
                self.by_key[tree_key(w)] = GuardedPass(
                    f"prio's tree on queues of known length ({w} worker{'s' if w > 1 else ''})",
                    lambda w=w: measure_tree(w, progress=self._tick))
            if sched in SORTED_WALK:  # its walk's pairs beside its companion (dmdasd's decisions fit none)
                self.by_key[pairs_key(w, sched)] = GuardedPass(
                    f"{sched} beside {WALKING[sched]}, alternated ({w} worker{'s' if w > 1 else ''})",
                    lambda w=w, sched=sched: measure_walk_pairs(w, sched, WALKING[sched], progress=self._tick))
        for r in range(1, ROUNDS):  # each scheduler's later sessions, interleaved (tilecast.loop.probe_rounds)
            for w, sched in self.sched_todo:
                self.by_key[round_key(probe_key(w, sched), r)] = self._sched_pass(w, sched, r)
        if self.todo:
            self.by_key[STEP_GAPS_KEY] = GuardedPass("the step probe's gaps (eager, 1 worker)",
                                                     lambda: measure_step_gaps(progress=self._tick))

    def _sched_pass(self, w: int, sched: str, r: int):
        from tilecast.loop.interference import GuardedPass

        what = f"executor probes ({sched}, {w} worker{'s' if w > 1 else ''}, session {r + 1} of {ROUNDS})"
        return GuardedPass(what, lambda: measure_probes(w, SCHED_PROBES, SCHED_REPEATS, sched, progress=self._tick))

    def sched_result(self, w: int, sched: str):
        """``sched``'s probe result on ``w`` workers: the median of the sessions taken
        (:func:`tilecast.loop.probe_rounds.median_round`)."""
        passes = [self.by_key.get(round_key(probe_key(w, sched), r)) for r in range(ROUNDS)]
        return median_round([p.result for p in passes if p is not None and p.result is not None])

    @property
    def passes(self) -> list:
        return list(self.by_key.values())

    def _tick(self):
        if self.tick is not None:
            self.tick()

    def fit(self, machine, cal) -> tuple[dict, object]:
        """(fits, kernel calibration) from the sessions' results: the stored fits with the measured ones set, and
        ``cal`` taught by the probes' traces."""
        from tilecast.loop.decision_cost import DECIDING, WALKING
        from tilecast.loop.queue_probe import level_cost, walk_curve
        from tilecast.loop.walk_pairs import pair_ratio
        from tilecast.perfmodel.calibration import PROBE_TRACE
        from tilecast.perfmodel.from_trace import calibration_from_trace

        fits = dict(self.base)
        for w in self.todo:
            points, overheads, traced, submit = self.by_key[w].result
            fits[w] = HostCost.fit(w, points, overheads)
            fits[w].fit_gap_model(traced)
            fits[w].submit_task_s = submit
            for graph, trace in traced:
                cal = calibration_from_trace(graph, trace, machine, base=cal, source=PROBE_TRACE)
        self._fit_end_bytes(fits, machine, cal)
        probes, graphs = {}, {}
        for w, sched in self.sched_todo:  # a scheduler's own cost per task and per step, on the same probes
            points, overheads, traced, submit = self.sched_result(w, sched)
            probe = fit_beside(fits.get(w), w, points, overheads)
            probe.fit_gap_model(traced)
            # its worker count's cost per byte (measured now or stored), before the walk and decisions are fitted by
            # simulating the probes: fitted without it, as until host-cost format 23, they took up what predictions
            # then charged again per byte (dmdasd's two-worker reading 124.5 ns a task read, 95.8 with it, on one
            # calibration of the 2-core Xeon)
            if w in fits:
                probe.gap_end_byte_s, probe.gap_byte_cap = fits[w].gap_end_byte_s, fits[w].gap_byte_cap
            probe.probe_points = len(points)
            probe.submit_task_s = submit
            probes[w, sched], graphs[w, sched] = probe, [g for g, _ in traced]
        for w in sorted({w for w, _ in probes}):  # before the walks, which are fitted on the costs between tasks
            pool_gap_models(fits.get(w), [p for (pw, s), p in probes.items() if pw == w and s in POOLED])
        for (w, sched), probe in probes.items():
            if SORTED_KEY in self.by_key and sched in SORTED_WALK:
                probe.walk_step_s, probe.walk_far_s, probe.walk_knee = walk_curve(self.by_key[SORTED_KEY].result)
            if sched in TREE_MEASURED and tree_key(w) in self.by_key:
                set_measured_tree(probe, sched_probe_fit(fits, w, WALKING[sched]),
                                  level_cost(self.by_key[tree_key(w)].result))
            elif sched in WALKING:
                pairs = self.by_key[pairs_key(w, sched)].result if pairs_key(w, sched) in self.by_key else None
                fit_walks(probe, machine.with_workers(w), cal, sched_probe_fit(fits, w, WALKING[sched]), sched,
                          graphs[w, sched], pair_ratio(pairs) if pairs else None)
            if sched in DECIDING:
                fit_decisions(probe, machine.with_workers(w), cal, fits.get(probe_key(w, DECIDING[sched])), sched,
                              graphs[w, sched])
            fits[probe_key(w, sched)] = probe
            fits.setdefault(fit_key(w, sched), probe)  # runs may have taught this scheduler's fit already
        return fits, cal

    def _fit_end_bytes(self, fits: dict, machine, cal) -> None:
        """Set the cost per byte of a worker's ended task (:mod:`tilecast.loop.gap_bytes`) on every worker count's
        fit measured in these sessions (the step probe's start delays beyond one worker's model, eager's on the
        probes); :meth:`fit` gives each scheduler's probe fit its worker count's."""
        from tilecast.loop.gap_bytes import cache_cap, fit_end_byte_cost

        base = fits.get(1)
        if STEP_GAPS_KEY in self.by_key and base is not None and base.task_overhead_s is not None:
            cap = cache_cap(machine, cal)
            cost = fit_end_byte_cost(self.by_key[STEP_GAPS_KEY].result,
                                     (base.task_overhead_s, *base.gap_costs[:5]), cap)
            for w in self.todo:
                fits[w].gap_end_byte_s, fits[w].gap_byte_cap = cost, cap
