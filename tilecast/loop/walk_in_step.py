"""A sorted insertion's cost per queued task walked past, as a step's insertions pay it.

dmdas and dmdasd insert every task into its worker's queue in priority order, walking from the list's head
(StarPU 1.3.10, ``fifo_queues.c``, ``_starpu_fifo_push_sorted_task``). The queue probe
(:func:`tilecast.loop.queue_probe.measure_sorted`) times that walk on a queue of known length with nothing
run between the insertions: on the 2-core Intel Xeon guest 2.7 ns a step over an insertion's first 200 or so,
7.6 ns beyond (the list's head stays in the first-level cache). In a step the walk costs more. Measured there
(dmdas against dmda on the same graph, alternated StarPU sessions of three traced steps, the workers' idle time
over the steps the simulated dmdas walks): on one worker 5.8 ns a step over nine graphs of 1,214-13,402 tasks,
kernels running between a worker's insertions; on two workers 32 ns (llama-3x192 at tile 64, 177,179 steps)
and 37 ns (gpt2-4x128 at tile 32, 818,060 steps), the tasks walked past having last been written by the other
core. The executor's scheduler probes show the same in their stored makespans: on their largest graph
(gpt2-tiny 8 x 128 at tile 16, 13,402 tasks) 6-19 ns a step on one worker and 48-72 ns on two in four
calibrations (the homes of accuracy runs 68-71); on the two smaller
ones (14-65 thousand steps) the difference is lost in the runs' spread (from -61 to +634 ns a step), so that a
walk fitted on all three, held to the queue probe's near cost, came out that near cost on one worker and none
on two, where the suite's Llama rows under dmdas ran 5-10% longer than under dmda and were forecast equal.

So the walk is also fitted on the probe with the most tasks alone, as its makespan's ratio to its companion
policy's (dmda, measured on the same probe), between the queue probe's near cost and :data:`WALK_BOUND`, every
step at least at that cost (the far steps at the larger of the two); the forecast takes it where it is dearer
than the walk fitted on all the probes.
"""

from __future__ import annotations

#: at most this many seconds a step walked past: about three times the dearest the longest probe gave (72 ns, two
#: workers); a fit beyond it has measured something else
WALK_BOUND = 2e-7


def far_with(far: float, walk: float) -> float:
    """The cost a step past the knee with an in-step ``walk``: at least the walk (0 far: the walk everywhere)."""
    return max(far, walk) if far > 0.0 else 0.0


def longest_probe(graphs) -> int:
    """Index of the probe graph with the most tasks (the longest queues a sorted policy walks)."""
    return max(range(len(graphs)), key=lambda i: graphs[i].n_tasks)


def fit_in_step_walk(machine, calibration, graphs, makespans, sched: str, beside, floor: float = 0.0) -> float:
    """Seconds a step walked past that make ``sched``'s simulated makespan of the longest probe of ``graphs``
    stand to its companion's as measured (``beside``: (companion policy, its makespans measured on the same
    probes)), within ``floor`` (the queue probe's near cost) and :data:`WALK_BOUND`; 0 without ``beside``.

    ``machine``: the probe's costs as fitted (the companion's per-task cost, the queue probe's far cost and
    knee); a step beyond the knee costs the larger of the far cost and the walk (:func:`far_with`)."""
    from tilecast.loop.decision_cost import _fit_walk, _probe_target

    if beside is None or not graphs:
        return 0.0
    i = longest_probe(graphs)
    ref_sched, ref = beside
    durations, target = _probe_target(machine, calibration, [graphs[i]], [makespans[i]], (ref_sched, [ref[i]]))
    return _fit_walk(machine, sched, [graphs[i]], durations, target, cap=WALK_BOUND, floor=float(floor),
                     far_at_least_walk=True)[0]
