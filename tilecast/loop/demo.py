"""The demo: calibrate this computer, tune a small GPT, run the top choices on StarPU, write the report.

Everything is cached after the first run (kernel calibration, StarPU's per-step
cost, StarPU's own performance models), so a second demo is quicker.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass

import pandas as pd

from tilecast.graph.model_config import from_dict

DEMO_MODEL = {"name": "gpt2-2x256", "n_layer": 2, "n_embd": 256, "n_head": 4, "vocab_size": 2048,
              "n_positions": 256}
DEMO_BATCH, DEMO_SEQ = 4, 128
DEMO_SCHEDS = ("eager", "lws", "dmda")


@dataclass
class DemoResult:
    folder: str
    tune: object
    execution: object
    paths: dict
    seconds: float

    def summary(self) -> dict:
        best = self.execution.checked[0]
        errors = [abs(c.error) for c in self.execution.checked]
        return {"folder": self.folder, "report": self.paths.get("html"), "seconds": self.seconds,
                "configurations": len(self.tune.ranking), "executed": self.execution.rows(),
                "best": best.row(), "median_abs_error": float(pd.Series(errors).median()),
                "max_abs_error": float(max(errors)), "load_average": list(self.execution.load_average)}


def default_model():
    return from_dict(DEMO_MODEL, name=DEMO_MODEL["name"])


def run_demo(folder: str, cfg=None, batch: int = DEMO_BATCH, seq: int = DEMO_SEQ, top: int = 2, others: int = 1,
             steps: int = 3, warmup: int = 2, scheds=DEMO_SCHEDS, tilings=None, progress: bool = True) -> DemoResult:
    """Tune ``cfg`` (default: a 2-layer, 256-wide GPT) on this computer, execute the ``top`` best and
    ``others`` from the rest, and write the report folder."""
    from tilecast.loop.execute import execute
    from tilecast.loop.tune import pick_for_execution, tune

    t0 = time.perf_counter()
    cfg = cfg or default_model()
    say = (lambda msg: print(msg, file=sys.stderr)) if progress else (lambda msg: None)
    say(f"tuning {cfg.name}, batch {batch} x {seq}, on this computer (first run: calibrating)")
    result = tune(cfg, batch, seq, scheds=scheds, tilings=tilings, progress=progress)
    chosen = pick_for_execution(result.ranking, top, others)
    say(f"{len(result.ranking)} configurations simulated; running {len(chosen)} on StarPU")
    ex = execute(chosen, result.ranking, result.machine, result.calibration, result.host_costs, steps=steps,
                 warmup=warmup, progress=progress)
    paths = write_report(folder, result, ex)
    return DemoResult(os.path.abspath(folder), result, ex, paths, time.perf_counter() - t0)


def write_report(folder: str, result, ex) -> dict:
    """The best executed configuration's comparison report at the top of ``folder``, every other one under
    ``configs/``, the ranking and the predicted-versus-measured table beside them."""
    os.makedirs(folder, exist_ok=True)
    paths = dict(ex.checked[0].comparison().write(folder))
    for c in ex.checked[1:]:
        sub = os.path.join(folder, "configs", f"rank{c.rank:03d}-{c.prediction.config.sched}-w"
                                              f"{c.prediction.config.workers}")
        paths[f"rank{c.rank}"] = c.comparison().write(sub, chrome=False)["html"]
    ranking = pd.DataFrame([p.row() for p in result.ranking])
    ranking["peak_memory_bytes"] = ranking["peak_memory_bytes"].map(lambda d: sum(d.values()))
    paths["ranking_csv"] = os.path.join(folder, "ranking.csv")
    ranking.to_csv(paths["ranking_csv"], index_label="rank0")
    paths["executed_json"] = os.path.join(folder, "executed.json")
    with open(paths["executed_json"], "w") as f:
        json.dump(ex.rows(), f, indent=1, default=float)
    return paths
