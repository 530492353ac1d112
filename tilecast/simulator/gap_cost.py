"""The runtime's cost between a worker's tasks, per task, as the simulation charges it.

Beyond the fixed cost before every task (``Machine.task_overhead``), a
StarPU CPU worker spends, between the end of one task and the start of its
next, time per buffer of the task it starts (acquiring each,
``_starpu_fetch_task_input``) and per buffer and per successor of the task it
ended (writing back each buffer, ``_starpu_push_task_output``; releasing each
buffer's implicit dependencies and notifying each successor,
``_starpu_handle_job_termination`` in src/core/jobs.c), all in its own
thread (``_starpu_cpu_driver_run_once``, src/drivers/cpu/driver_cpu.c,
StarPU 1.3.10). The simulation charges the first before the task starts
(``before``) and the others to the ending worker, whose next task starts no
earlier than when they are done (``release``, plus ``Machine.gap_ready`` per
successor it makes ready, pushing it to the scheduler): the successors it releases
are pushed at its task's end, as the scheduler sees them, while it is still
busy releasing. StarPU's own predictions (the dm family's expected start
and length) do not include either; nor do the simulated ones.

On several workers, a task that starts on another worker than the one whose
ended task made it ready (a handoff: pushed by ``_starpu_handle_job_termination``
on one core, popped by ``_starpu_get_worker_task`` and its buffers acquired by
``_starpu_fetch_task_input`` on the other) costs ``Machine.gap_handoff`` more
before it starts: the engine records which worker made each task ready
(``Engine.made_by``) and charges it in ``_begin``, the fused loop and the C
loop alike.
Measured by :func:`tilecast.loop.runtime_overhead.fit_gap_model`.

After a task of many bytes the worker's own structures and code are no
longer in its core's cache: ``Machine.gap_end_byte`` per byte the ended task
accessed, up to ``Machine.gap_byte_cap`` (the core's cache), is charged to the
ending worker with the rest (measured on a step of larger tasks than the
executor's probes: :mod:`tilecast.loop.gap_bytes`).
"""

from __future__ import annotations

import numpy as np


def charges(graph, machine) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(seconds charged before each task starts, seconds each task's ending worker spends releasing it, but for
    ``machine.gap_ready`` per successor it makes ready, which the loops count as they run), or (None, None) when
    ``machine`` has no cost between tasks beyond its fixed one."""
    a, b, c = machine.gap_start_buffer, machine.gap_end_buffer, machine.gap_successor
    e = machine.gap_end_byte
    if a == 0.0 and b == 0.0 and c == 0.0 and e == 0.0 and machine.gap_ready == 0.0:
        return None, None
    n = graph.n_tasks
    nbuf = np.diff(np.asarray(graph.acc_ptr, dtype=np.int64)).astype(np.float64)
    pred = np.asarray(graph.dependencies[1], dtype=np.int64)
    nsucc = np.bincount(pred, minlength=n).astype(np.float64)
    release = b * nbuf + c * nsucc
    if e > 0.0:
        from tilecast.perfmodel.reuse import task_bytes

        release = release + e * np.minimum(task_bytes(graph), machine.gap_byte_cap)
    return a * nbuf, release
