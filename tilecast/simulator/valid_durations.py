"""The durations a simulation takes: seconds >= 0 per worker kind and task, ``inf`` where a kind cannot run it.

NaN, a negative duration, or a task that no worker of the machine can run (``inf`` on every kind its workers
have) has no simulated outcome: :func:`check_durations` refuses them before any loop runs, naming the first
such task, where the loops would otherwise end with NaN or infinite start and end times.

Only the dm family (dm, dmda, dmdas, dmdasd) chooses among the workers that can run a task: it places each on
the worker of the earliest expected end, and an ``inf`` duration never is. The other policies' queues
(eager, prio, random, ws, lws) hand a task to whichever worker asks for one; their model does not check
whether the worker can run it (StarPU's ``starpu_worker_can_execute_task``), so under them every task must
have a finite duration on every kind the machine's workers have. Durations from
:class:`tilecast.perfmodel.kernel_model.DurationModel` always do.
"""

from __future__ import annotations

import numpy as np

from tilecast.errors import FieldError

#: policies whose simulated decisions skip the workers a task's ``inf`` duration says cannot run it
CHOOSE_AMONG_KINDS = ("dm", "dmda", "dmdas", "dmdasd")


def check_durations(durations: np.ndarray, kind_names, worker_kind, sched: str) -> None:
    """Raise :class:`FieldError` ("durations: ...") for durations the simulation cannot take (module doc).

    durations: (kinds, tasks) seconds, rows in ``kind_names`` order (one row: every kind's);
    worker_kind: each worker's row."""
    d = np.atleast_2d(durations)
    if not len(worker_kind):  # no workers at all: the loops say so
        return
    bad = np.isnan(d) | (d < 0)
    if bad.any():
        k, t = np.argwhere(bad)[0]
        raise FieldError(f"durations: task {t} takes {d[k, t]} s on worker kind {_kind(kind_names, d, k)!r}; "
                         f"a duration is seconds >= 0, or inf where the kind cannot run the task")
    rows = sorted({int(k) for k in worker_kind}) if len(d) > 1 else [0]
    runnable = np.isfinite(d[rows])
    if not runnable.all(axis=0).all():
        nowhere = ~runnable.any(axis=0)
        if nowhere.any():
            t = int(np.argmax(nowhere))
            raise FieldError(f"durations: task {t} is inf on every worker kind of the machine "
                             f"({', '.join(_kind(kind_names, d, k) for k in rows)}): no worker can run it")
        if sched not in CHOOSE_AMONG_KINDS:
            k, t = np.argwhere(~runnable)[0]
            raise FieldError(f"durations: task {t} is inf on worker kind {_kind(kind_names, d, rows[k])!r}; "
                             f"policy {sched!r} gives a task to any worker that asks, so every task needs a finite "
                             f"duration on every kind (only {', '.join(CHOOSE_AMONG_KINDS)} choose among the "
                             f"kinds that can run it)")


def _kind(kind_names, d, k) -> str:
    return str(kind_names[k]) if len(d) > 1 else "/".join(map(str, kind_names))
