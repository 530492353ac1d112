"""``tc.simulate_policies``: one step predicted under every scheduling policy (``tilecast simulate
--compare-policies``), on one graph and one set of task durations."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tilecast.api.base import _config, _Result, _shape, _tiling


def prediction_row(p, machine, simulation_s: float) -> dict:
    """A prediction's figures as ``tilecast simulate --json`` gives them: the step time first, then its parts,
    then the simulation's summary (``simulation_s``: seconds the simulation took)."""
    from tilecast.loop.predict import host_note

    s = dict(p.summary)
    s.pop("makespan_s")
    return {"step_s": p.step_s, "makespan_s": p.makespan_s, "host_s": p.host_s, "host_known": p.host_known,
            "host_cost": host_note(p, machine), **s, "tiles": p.tiles, "simulation_s": simulation_s,
            "task_overhead_us": p.task_overhead_s * 1e6, "task_overhead_source": p.task_overhead_source}


@dataclass
class PoliciesResult(_Result):
    """The same step predicted under each scheduling policy; ``to_frame()`` has one row per policy (the
    figures of :func:`prediction_row`, without the per-worker, per-link and per-node lists)."""

    model: str
    batch: int
    seq: int
    tiling: str
    recompute: str
    machine: str
    workers: int
    calibration: str
    duration_sources: dict
    memory_limit_bytes: int | None = None
    rows: list = field(repr=False, default_factory=list)  # one prediction_row per policy

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([{k: v for k, v in r.items() if not isinstance(v, (dict, list))} for r in self.rows])

    def _headline(self) -> str:
        best = min(self.rows, key=lambda r: r["step_s"]) if self.rows else {}
        return (f"{self.model} {self.batch}x{self.seq} tile {self.tiling} on {self.machine}, {self.workers} workers: "
                f"fastest {best.get('sched')} {1e3 * best.get('step_s', 0):.3f} ms")


def simulate_policies(model="gpt2", batch: int = 4, seq: int = 256, tile="256", machine="local",
                      workers: int | None = None, calibration: str | None = None, transfers: bool = True,
                      sched_seed: int = 0, recompute: str = "none", memory_limit: str | int | None = None,
                      offload_dir: str | None = None, policies=None, progress=None,
                      offload_io: str = "buffered") -> PoliciesResult:
    """Predict one step under each of ``policies`` (default: every policy the simulator has) as
    :func:`tilecast.api.simulate` predicts it under one, building the graph and computing the task durations
    once. Arguments as :func:`tilecast.api.simulate`'s; ``progress``: called with each policy's name and the step's
    task count before the policy is simulated."""
    from tilecast.api import _prepared_step
    from tilecast.errors import FieldError
    from tilecast.loop.config import StepConfig
    from tilecast.loop.predict import predict
    from tilecast.simulator.simulate import POLICIES

    cfg, tiling = _config(model), _tiling(tile)
    _shape(cfg, batch, seq)
    policies = list(POLICIES) if policies is None else list(policies)
    bad = [p for p in policies if p not in POLICIES]
    if bad or not policies:
        raise FieldError(f"policies: must be among {', '.join(POLICIES)}, got {', '.join(bad) or 'none'}")
    st = _prepared_step(cfg, batch, seq, tiling, machine, workers, calibration, recompute, memory_limit,
                        offload_dir, offload_io)
    m, n, cal, g = st.machine, st.workers, st.calibration, st.graph
    rows = []
    for sched in policies:
        if progress is not None:
            progress(sched, g.n_tasks)
        t0 = time.perf_counter()
        p = predict(StepConfig(cfg, batch, seq, tiling, sched, n, recompute), m, cal, st.host_costs, graph=g,
                    durations=st.durations, keep_result=False, transfers=transfers, seed=sched_seed,
                    memory=st.forecast)
        rows.append(prediction_row(p, m, time.perf_counter() - t0))
    return PoliciesResult(cfg.name, batch, seq, tiling.describe(), recompute, m.name, n,
                          "stored" if cal is not None else "none (machine roofline figures)",
                          dict(st.provenance), None if st.limit is None else st.limit.limit_bytes, rows)
