"""Tasks bound to in-order streams (CUDA-stream semantics), on the simulator's engine."""

from __future__ import annotations

import numpy as np

from tilecast.simulator.engine import Engine
from tilecast.simulator.policies.fixed import FixedInOrder


def simulate_streams(duration: np.ndarray, stream: np.ndarray, pred_ptr: np.ndarray, pred: np.ndarray,
                     n_streams: int) -> tuple[np.ndarray, np.ndarray]:
    """Start and end time of every task when each task runs on a fixed stream.

    Each stream runs its tasks one at a time, in submission (index) order, like
    a CUDA stream; a task starts as soon as its stream has finished the
    previous task bound to it *and* all its predecessors have ended. Runs on
    :class:`tilecast.simulator.engine.Engine` with the
    :class:`~tilecast.simulator.policies.fixed.FixedInOrder` policy and no
    per-task overhead.

    Parameters
    ----------
    duration: float array (n,), seconds of each task (>= 0).
    stream: int array (n,), the stream of each task, in ``0..n_streams-1``.
    pred_ptr, pred: CSR predecessor lists (int64 (n+1,), int32); every
        predecessor must have a smaller index than its task.
    n_streams: number of streams.

    Returns ``(start, end)``, float64 arrays (n,), seconds from time 0.
    Raises ValueError on inconsistent inputs.
    """
    duration = np.asarray(duration, dtype=np.float64)
    stream = np.asarray(stream, dtype=np.int64)
    pred_ptr = np.asarray(pred_ptr, dtype=np.int64)
    pred = np.asarray(pred, dtype=np.int64)
    n = len(duration)
    if len(stream) != n:
        raise ValueError(f"stream has {len(stream)} entries, duration {n}")
    if len(pred_ptr) != n + 1 or pred_ptr[0] != 0 or pred_ptr[-1] != len(pred) or np.any(np.diff(pred_ptr) < 0):
        raise ValueError(f"pred_ptr must be a non-decreasing CSR pointer of length {n + 1} ending at len(pred)")
    if n_streams < 1:
        raise ValueError(f"n_streams must be >= 1, got {n_streams}")
    if n and (np.any(duration < 0) or not np.all(np.isfinite(duration))):
        raise ValueError("duration must be finite and >= 0")
    owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(pred_ptr))
    if len(pred) and (pred.min() < 0 or np.any(pred >= owner)):
        raise ValueError("every predecessor must be an earlier task (pred[i] < task)")
    if n == 0:
        return np.zeros(0), np.zeros(0)
    engine = Engine(duration[None, :], pred_ptr, pred, [0] * n_streams, [0] * n_streams,
                    FixedInOrder(stream)).run()
    start, end, _ = engine.arrays()
    return start, end
