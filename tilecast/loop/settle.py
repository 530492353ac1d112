"""Bring the machine to the speed it keeps under sustained load before measuring.

Some machines do not run at one speed: on the 2-core development machine, a
gpt2-tiny step (32 x 128, tile 64, eager) took 35.5-36.2 ms for the first
30 seconds of continuous StarPU runs, then 44.0-45.1 ms for as long as the
load lasted (75 s measured), and 36 ms again after 20 idle seconds; other
runs started slow and sped up. Most likely the host grants the virtual cores
a burst of speed, then a lower sustained rate. A
training run lives at the sustained rate, and so should the measurements its
predictions are checked against: mixing the two makes a configuration 24%
slower or faster depending on when it ran. :func:`settle` runs that small step
on every worker for a while first, and reports the step times it saw, so the
shift (if any) shows in the results' conditions.
"""

from __future__ import annotations

import sys
import time

import numpy as np

SETTLE_CONFIG = ("gpt2-tiny", 32, 128, "64", "eager")


def settle(seconds: float, workers: int | None = None, progress: bool = True) -> dict:
    """Run small StarPU training steps on every worker for ``seconds``; their times at the start and the end."""
    from tilecast.executor.starpu_run import StarPUTraining
    from tilecast.executor.starpu_session import StarPUSession
    from tilecast.executor.step import TrainState, init_gpt2_params
    from tilecast.graph import Tiling
    from tilecast.graph.gpt2 import build_gpt2_step
    from tilecast.graph.model_config import load_model

    if seconds <= 0:
        return {"settle_s": 0.0}
    name, batch, seq, tile, sched = SETTLE_CONFIG
    cfg = load_model(name)
    graph = build_gpt2_step(cfg, batch, seq, Tiling.parse(tile))
    data = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(2, batch, seq + 1))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=int(seconds), desc="settling the cores at their sustained speed", unit="s", file=sys.stderr,
                   leave=False)
    times, stamps = [], []
    t0 = time.perf_counter()
    try:
        with StarPUSession(sched, workers) as session:
            training = StarPUTraining(session, graph, TrainState(init_gpt2_params(cfg, 0)), data)
            while time.perf_counter() - t0 < seconds:
                training.t = 0  # the same batch again: only the time matters
                times.append(training.step(trace=False)[0])
                stamps.append(time.perf_counter() - t0)
                if bar is not None:
                    bar.n = min(int(stamps[-1]), int(seconds))
                    bar.refresh()
    finally:
        if bar is not None:
            bar.close()
    t = np.asarray(times)
    k = max(1, len(t) // 5)
    return {"settle_s": float(stamps[-1]) if stamps else 0.0, "settle_steps": int(len(t)),
            "settle_first_step_s": float(np.median(t[:k])), "settle_last_step_s": float(np.median(t[-k:]))}
