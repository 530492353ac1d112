"""What a scheduling decision costs, fitted on StarPU probe steps by simulating them.

dmdasd decides where a ready task goes by reading, on every worker, the
predicted length of each queued task of at least its priority
(``_starpu_fifo_get_exp_len_prev_task_list``, src/sched_policies/fifo_queues.c,
called from ``compute_all_performance_predictions``,
src/sched_policies/deque_modeling_policy_data_aware.c), under each worker's
lock (``starpu_worker_lock``). On the probe steps of this 2-core machine
that cost grows with the queues: a mean start delay of 5.5 us per task on a
1,218-task step, 12 us on a 13,406-task step (1 worker), and the steps ran
1.6-3x longer than dmdas's, the same policy without that reading; a 1-worker
step ran as long as a 2-worker one, so decisions do not overlap.

The simulator charges each decision ``lock * other workers + scan * queued
tasks read`` on one scheduler that no task starts past
(:meth:`tilecast.simulator.engine.Engine.decide`); a decision made by a worker
runs after that worker's release of its ended task and its earlier pushes, as
StarPU runs them one after the other in that worker's thread. The two costs are fitted
here: the probe steps are simulated with the kernel calibration and the
policy's per-task cost without decisions (dmdas's), and ``scan`` and
``lock`` are chosen so that the simulated makespans match the measured ones
(least squares on the relative error). The probes are not the configurations
being predicted, so a forecast made with these costs never learned from the
configuration itself.

dmdas and dmdasd also pay for inserting a task into a worker's queue sorted
by priority: ``_starpu_fifo_push_sorted_task`` (src/sched_policies/fifo_queues.c)
walks the list from its head past every queued task of at least the new
one's priority, in the thread that pushes (``push_task_on_best_worker``,
deque_modeling_policy_data_aware.c), mostly a worker releasing the
successors of the task it ended. On this machine's 1-worker probes dmdas
ran 18-30% longer than dmda (the same decisions, queues not sorted), more on
the larger steps, whose queues are longer. :func:`fit_push_walk` fits the
cost per task walked past (``Machine.push_walk``; charged by
:meth:`tilecast.simulator.engine.Engine.walk`) so that the simulated ratio of
dmdas's probe makespans to dmda's matches the measured one, the per-task cost
being dmda's on the same probes.

prio searches its red-black tree of priority stages on every push and pop
(:mod:`tilecast.simulator.queue_costs`): the same fit, beside eager (the
same central queue without priorities), gives its cost per tree level.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import least_squares, minimize_scalar

from tilecast.graph.priorities import reads_queued_tasks

#: policies whose decisions the simulator charges (Engine.decide), and the policy measured beside each
#: for its per-task cost without them
DECIDING = {"dmdasd": "dmdas"}
#: policies whose search through a sorted queue the simulator charges (Engine.walk; a task walked past, a level
#: of prio's tree), and the policy measured beside each
#: for its per-task cost without them
WALKING = {"dmdas": "dmda", "prio": "eager"}
#: the walk's costs first tried (s per queued task walked past): none, then 1 ns to 1 us evenly in log; the fit
#: refines around the best of them (the makespans move in steps with it: a gradient from the start can stall)
WALK_GRID = (0.0,) + tuple(np.geomspace(1e-9, 1e-6, 13).tolist())


def companions(sched: str) -> list:
    """The policies whose probes a policy's own costs are fitted beside, measured first, then the policy
    itself: dmdasd -> [dmda, dmdas, dmdasd]."""
    first = DECIDING.get(sched) or WALKING.get(sched)
    return (companions(first) if first else []) + [sched]
#: the costs' scales (s): a queued task read, another worker's queue locked (the fit's units), and where
#: the fit starts; a weak pull towards the start keeps a cost the probes cannot tell (the lock, on 1 worker,
#: where only the submitting thread locks another queue) from drifting
SCALE = np.array([1e-7, 1e-5])
START = np.array([1.0, 0.5])
PULL = 0.01


def fit_decision_cost(machine, calibration, graphs, makespans, sched: str = "dmdasd") -> tuple[float, float]:
    """(seconds per queued task read, seconds per other worker locked) that make the simulated makespans of
    ``graphs`` under ``sched`` on ``machine`` (its per-task cost already set) match ``makespans``, fitted on one
    worker count's probes. With a declared priority range
    (:func:`tilecast.graph.priorities.reads_queued_tasks` false) a decision reads no queued task: the cost per
    read is 0 and the other is fitted alone (a decision's cost per other worker, the sums' upkeep).

    Why per count: a queued task read on two workers is a list node that the other worker's thread also
    writes (it pops and pushes on the queues read), so it misses in the reading core's cache more often than
    on one worker. With the simulator's decisions after a worker's earlier work (host-cost format 20), the
    reading fitted per count came out 43-70 ns on one worker and 88-100 ns on two in six calibrations of the
    2-core Xeon (accuracy runs 78-83; 78-81 refitted on their stored probes), and the suite predicted again from
    runs 78-82's calibrations missed by at most 9.4-20.0% with them, 14.2-25.5% with one reading cost for both
    counts (docs/accuracy.md, run 82)."""
    from tilecast.perfmodel.kernel_model import DurationModel
    from tilecast.simulator.simulate import simulate

    model = DurationModel(machine, calibration)
    durations = [model.durations(g) for g in graphs]
    measured = np.asarray(makespans, dtype=np.float64)

    reads = reads_queued_tasks(sched)  # else a declared priority range: one sum per worker, no task read
    fitted = slice(0, 2) if reads else slice(1, 2)

    def residuals(v):
        x = np.zeros(2)
        x[fitted] = np.maximum(v, 0.0)
        m = machine.with_decision_cost(x[0] * SCALE[0], x[1] * SCALE[1])
        sim = np.array([simulate(g, m, sched, durations=d).makespan for g, d in zip(graphs, durations)])
        return np.concatenate([(sim - measured) / measured, PULL * (x[fitted] - START[fitted])])

    fit = least_squares(residuals, x0=START[fitted], bounds=(0.0, np.inf), diff_step=0.05, max_nfev=60)
    x = np.zeros(2)
    x[fitted] = np.maximum(fit.x, 0.0)
    return float(x[0] * SCALE[0]), float(x[1] * SCALE[1])


def _probe_target(machine, calibration, graphs, makespans, beside):
    """The probe ``graphs``' durations, and the makespans a simulation of them should give: the measured ones,
    or with ``beside`` (policy, makespans measured under it) the measured ratio to that policy's makespans times
    its simulated ones on ``machine``."""
    from tilecast.perfmodel.kernel_model import DurationModel
    from tilecast.simulator.simulate import simulate

    model = DurationModel(machine, calibration)
    durations = [model.durations(g) for g in graphs]
    target = np.asarray(makespans, dtype=np.float64)
    if beside is not None:
        ref_sched, ref_measured = beside
        ref_sim = np.array([simulate(g, machine, ref_sched, durations=d).makespan for g, d in zip(graphs, durations)])
        target = target / np.asarray(ref_measured, dtype=np.float64) * ref_sim
    return durations, target


def _misfit(machine, sched, graphs, durations, target) -> float:
    from tilecast.simulator.simulate import simulate

    sim = np.array([simulate(g, machine, sched, durations=d).makespan for g, d in zip(graphs, durations)])
    r = (sim - target) / target
    return float(r @ r)


def _fit_walk(machine, sched, graphs, durations, target, cap: float = 0.0, floor: float = 0.0,
              far_at_least_walk: bool = False) -> tuple[float, float]:
    """(walk, its misfit): the grid, then a bounded refinement around its best point; with ``cap`` > 0 (the
    cost a step measured on StarPU, :func:`tilecast.loop.queue_probe.measure_sorted`) no walk above it, with
    ``floor`` none below it. ``far_at_least_walk``: the steps past the machine's knee cost at least the walk
    (:func:`tilecast.loop.walk_in_step.far_with`)."""
    from tilecast.loop.walk_in_step import far_with

    far, knee = float(machine.push_walk_far), float(machine.push_walk_knee)
    seen = {}

    def cost(walk: float) -> float:
        walk = max(float(walk), floor, 0.0)
        if cap > 0.0:
            walk = min(walk, cap)
        if walk not in seen:
            m = machine.with_push_walk(walk)
            if far_at_least_walk:
                m = m.with_walk_far(far_with(far, walk), knee)
            seen[walk] = _misfit(m, sched, graphs, durations, target)
        return seen[walk]

    grid = ([floor] if floor > 0.0 else []) + [g for g in WALK_GRID if g >= floor and (cap <= 0.0 or g < cap)]
    grid += [cap] if cap > 0.0 else []
    i = min(range(len(grid)), key=lambda j: cost(grid[j]))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    if hi > lo:
        minimize_scalar(cost, bounds=(lo, hi), method="bounded", options={"xatol": lo * 0.01 or 1e-11, "maxiter": 20})
    best = min(seen, key=seen.get)
    return float(best), seen[best]


def fit_push_walk(machine, calibration, graphs, makespans, sched: str = "dmdas", beside=None) -> float:
    """Seconds per queued task that a sorted insertion walks past, fitted on the measured ``makespans`` of
    ``graphs`` under ``sched`` on ``machine`` (its per-task cost set, without the walk; least squares on the
    relative error).

    ``beside``: (policy, makespans) of the same graphs measured under the same policy without sorted queues
    (dmda for dmdas): then the fit matches the simulated ratio of the two policies' makespans to the measured
    one, so that what the simulation gets wrong for both (kernel durations, the cost per task) is not taken
    for the walk's cost."""
    durations, target = _probe_target(machine, calibration, graphs, makespans, beside)
    return _fit_walk(machine, sched, graphs, durations, target)[0]


def fit_sorting(machine, calibration, graphs, makespans, sched: str, beside, own_overhead,
                cap: float = 0.0) -> tuple[float, float]:
    """(seconds per task walked past, the runtime's cost per task) of a sorted policy on its probes.

    Either the walk, with ``machine``'s cost per task (its companion's, measured beside it: ``beside``), or
    no walk and the policy's own measured cost per task (its probes' mean start delay, ``own_overhead``),
    whichever predicts the probes better: the walk as fitted on the other probes (:func:`_held_out_misfit`),
    the own cost as measured. Where the probes' queues are too short for the walk to show (two workers,
    sometimes), the policy's own start delays say more than a walk fitted to noise.

    ``cap`` (> 0): the cost of a step measured on StarPU on a queue of known length
    (:func:`tilecast.loop.queue_probe.measure_sorted`); the fitted walk stays at most that. The probes'
    searches walk past 28-90 tasks on average (at most about 500): a cost per step fitted on them takes in
    whatever else makes the sorted policy slower than its companion there, and a step 10x longer
    multiplies it (26 ns a step fitted, 2-8 ns measured; gpt2-2x384 at tile 32 on one worker, 876 steps a
    search, came out +192%)."""
    durations, target = _probe_target(machine, calibration, graphs, makespans, beside)
    walk, misfit = _fit_walk(machine, sched, graphs, durations, target, cap)
    if own_overhead is not None:
        alone = machine.with_task_overhead(own_overhead).with_push_walk(0.0)
        held_out = _held_out_misfit(machine, sched, graphs, durations, target, cap)
        if _misfit(alone, sched, graphs, durations, target) < (misfit if held_out is None else held_out):
            return 0.0, float(own_overhead)
    return walk, float(machine.task_overhead)


def _held_out_misfit(machine, sched, graphs, durations, target, cap: float = 0.0) -> float | None:
    """The walk's misfit as a forecast: each probe predicted with the walk fitted on the others, the squared
    relative errors summed (None with fewer than 3 probes). The policy's own cost per task is not fitted on
    the makespans, so its misfit on all probes is already one of a forecast; the walk's in-sample misfit is
    not, and a cost per step fitted to 3 probes of microsecond tasks can reproduce them and still be wrong
    on steps of longer tasks (prio on 2 workers: 301 ns a tree level fitted, the suite's small graphs
    predicted 5-31% slower than eager beside them against their measured ratios; docs/scheduling.md)."""
    if len(graphs) < 3:
        return None
    total = 0.0
    for i in range(len(graphs)):
        keep = [j for j in range(len(graphs)) if j != i]
        walk, _ = _fit_walk(machine, sched, [graphs[j] for j in keep], [durations[j] for j in keep],
                            target[keep], cap)
        total += _misfit(machine.with_push_walk(walk), sched, [graphs[i]], [durations[i]], target[i:i + 1])
    return total
