"""The runtime's cost between tasks after a task of many bytes, measured on a step of larger tasks than the
executor's probes.

The cost between a worker's tasks (:func:`tilecast.loop.runtime_overhead.fit_gap_model`) is fitted on the
executor's probes: gpt2-tiny steps whose tasks access 17-131 KB (medians) and whose tiles, 3-25 MB in all,
stay in the shared cache. In the accuracy suite's steps (52-1,510 MB of tiles) the same model left the gaps
short, and the more so after larger tasks: one worker, eager, traced steps against the model fitted on the
probes traced the same hour (2-core Xeon guest, 2026-12-05), 0.2-1.2 us a task more where the tasks access
54-91 KB on average, 1.0 us at 150-190 KB, 2.4 us at 290 KB, 8-19 us at 2.8-13.7 MB. Regressed on the tasks on
either side of each gap, the excess follows the bytes of the task that ended, not of the one that starts (in a
GPT-2 step at tile 32, 15 ns a KB against -5). A chain of 192 x 192 x 2048 GEMMs (3.2 MB each, distinct inputs)
alone on a worker waits 8.7-9.4 us between tasks (mean) where 32 x 32 x 32 ones wait 2.6-3.0 us. What the
runtime does between tasks (releasing the ended task's buffers and successors, pushing, popping, acquiring the
next task's buffers: StarPU 1.3.10, ``_starpu_cpu_driver_run_once``) is the same code whatever the task's size;
its structures and the code itself are what a large task's data have pushed out of the core's cache.

So the forecast charges, after every task, a cost per byte the task accessed, up to the core's cache (past
it the cache holds nothing of the runtime's any more): measured here on the step probe of the in-step terms
(:mod:`tilecast.loop.step_probe`: 849 tasks of 347 KB on average, not a suite configuration), traced on one
worker under eager: the slope of what its start delays exceed the executor probes' model by on the bytes of
the task before each. It is measured with every calibration of the executor's costs.
"""

from __future__ import annotations

import numpy as np

#: StarPU sessions of the step probe for this measurement (each a warm-up and three traced steps)
SESSIONS = 3
#: at most this many seconds per byte (52 us per MiB): a probe beyond it measured something else
BYTE_BOUND = 5e-11


def cache_cap(machine, calibration) -> float:
    """The bytes up to which the cost is charged: the calibrated worker kind's cache per core
    (:meth:`tilecast.perfmodel.kernel_model.DurationModel.cache_bytes`)."""
    from tilecast.perfmodel.kernel_model import DurationModel

    kind = calibration.kind if calibration is not None else machine.kind_names[0]
    return float(DurationModel(machine, calibration).cache_bytes(kind))


def fit_end_byte_cost(samples, coef, cap: float) -> float:
    """Seconds per byte of a worker's ended task (up to ``cap`` bytes) by which the start delays of ``samples`` =
    [(graph, real trace)] exceed the gap model ``coef`` (:data:`tilecast.loop.runtime_overhead.GAP_TERMS`
    order): the slope of their excess (but a preempted worker's,
    :data:`~tilecast.loop.runtime_overhead.PREEMPTED_S` above the model) on the capped bytes of the tasks they
    follow, by least squares with a constant; within 0 and :data:`BYTE_BOUND`.

    The constant takes what lengthens every delay of the probe alike (the guest's state of the moment, a step of
    more tiles than the executor's probes), which is not the bytes' cost: on the 2-core Xeon guest, four sets of
    three sessions right after the executor's probes gave 4.5-5.3 us per MiB beside a constant of 0.56-0.77 us,
    where the excess summed over the bytes alone gave 6.4-7.0 (and 11.0 in a slower spell)."""
    from tilecast.loop.runtime_overhead import PREEMPTED_S, gap_rows
    from tilecast.perfmodel.reuse import task_bytes

    excess, nbytes = [], []
    for graph, trace in samples:
        d, x, prev = gap_rows(graph, trace)
        r = d - x @ np.asarray(coef, dtype=np.float64)
        keep = r <= PREEMPTED_S
        excess.append(r[keep])
        nbytes.append(np.minimum(task_bytes(graph)[prev[keep]], cap))
    r, b = (np.concatenate(v) if v else np.zeros(0) for v in (excess, nbytes))
    if len(b) < 2 or np.ptp(b) <= 0.0:
        return 0.0
    slope = np.polyfit(b, r, 1)[0]
    return float(np.clip(slope, 0.0, BYTE_BOUND))


def measure_step_gaps(sessions: int = SESSIONS, progress=None) -> list:
    """[(graph, real trace)] of the step probe's traced steps on one worker under eager, ``sessions`` StarPU
    sessions of a warm-up and three traced steps."""
    from tilecast.loop.measure import measure_round
    from tilecast.loop.step_probe import PROBE_STEPS, PROBE_WARMUP, probe_config

    out = []
    for _ in range(sessions):
        _, _, res = measure_round(probe_config(), PROBE_STEPS, PROBE_WARMUP)
        out.extend((res.graph, t) for t in res.traces)
        if progress:
            progress()
    return out
