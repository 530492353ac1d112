"""``tc.memory``: what a training step holds in memory, its peak in submission order and the working set a
memory-limited run needs (the figures of :func:`tilecast.graph.analysis.live_memory` and
:func:`tilecast.executor.memory_limit.minimum_bytes`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tilecast.api.base import _config, _positive, _Result, _shape, _tiling


@dataclass
class MemoryResult(_Result):
    """Bytes of one step; ``to_frame()`` is the live-memory curve, one row per task in submission order."""

    model: str
    params: int
    batch: int
    seq: int
    tiling: str
    recompute: str
    workers: int
    tasks: int
    persistent_bytes: int  # parameters, gradients, optimizer states, inputs: the whole step
    activation_peak_bytes: int  # activations and temporaries live at the peak
    peak_bytes: int  # the two together: the step's peak with tasks in submission order
    peak_tag: str  # the phase of the first task at the peak
    working_set_bytes: int  # the least main memory a run with a disk offload needs on `workers` workers
    graph: object = field(repr=False, default=None)
    _title = "memory"

    def to_frame(self):
        """``task``, ``tag`` and ``live_bytes`` (persistent + activations live while the task runs)."""
        import numpy as np
        import pandas as pd

        from tilecast.graph.analysis import tile_lifetimes

        g = self.graph
        persistent = g.persistent_tiles()
        first, last = tile_lifetimes(g)
        used = (~persistent) & (last >= 0)
        delta = np.zeros(g.n_tasks + 1, dtype=np.int64)
        np.add.at(delta, first[used], g.tile_nbytes[used])
        np.add.at(delta, last[used] + 1, -g.tile_nbytes[used])
        live = np.cumsum(delta[:-1]) + self.persistent_bytes
        return pd.DataFrame({"task": np.arange(g.n_tasks), "tag": np.asarray(g.tags, dtype=object)[g.tag],
                             "live_bytes": live})

    def _headline(self) -> str:
        return (f"{self.model}, batch {self.batch} x {self.seq}, recompute {self.recompute}: peak "
                f"{self.peak_bytes / 1e9:.3f} GB ({self.persistent_bytes / 1e9:.3f} GB of states), working set "
                f"{self.working_set_bytes / 1e6:.1f} MB on {self.workers} worker(s)")


def memory(model="gpt2", batch: int = 4, seq: int = 256, tile="256", recompute: str = "none",
           workers: int = 1) -> MemoryResult:
    """A step's memory: the states, the activation peak and their sum with tasks run in submission order,
    and the working set a memory-limited run with a disk offload needs on ``workers`` workers (bytes)."""
    from tilecast.api import graph as build
    from tilecast.executor.memory_limit import minimum_bytes
    from tilecast.graph.analysis import live_memory

    cfg = _config(model)
    _shape(cfg, batch, seq)
    _positive("workers", workers)
    g = build(cfg, batch=batch, seq=seq, tile=_tiling(tile), recompute=recompute, compare_recompute=False)
    live = live_memory(g.graph)
    return MemoryResult(cfg.name, int(cfg.n_params()), batch, seq, g.tiling, recompute, workers, g.tasks,
                        live["persistent_bytes"], live["activation_peak_bytes"], live["peak_bytes"],
                        live["peak_tag"], int(minimum_bytes([g.graph], workers, offload=True)), g.graph)

