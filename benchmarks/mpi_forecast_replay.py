"""The rank forecast again on measurements already taken: each row of earlier ``mpi_forecast.py`` runs
predicted anew with the model as it is now, with the same background threads the run measured, against the
same measured step; beside it the forecast the run itself printed (``recorded``: the model and calibration
of that day) and the model now with one CPU time per submitted task and no CPU per message on the progress
threads (``flat``: ``forecast_ranks(..., submit_roles=False, message_cpu=False)``).

Reads the JSON line each ``benchmarks/mpi_forecast.py`` run prints last (a file holding its output); uses the
stored kernel and network calibrations. Figures of a model revised after seeing the measurements are not
forecasts of them: say so beside them (docs/mpi.md).

    python3 benchmarks/mpi_forecast_replay.py RUN.log [RUN2.log ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import numpy as np

from tilecast.graph import Tiling
from tilecast.graph.model_config import load_model
from tilecast.loop.predict import stored_models
from tilecast.loop.ranks_forecast import forecast_ranks, network_or_error
from tilecast.perfmodel import load_machine


def last_json(path: str) -> dict:
    with open(path) as f:
        lines = [ln for ln in f if ln.startswith("{")]
    if not lines:
        raise SystemExit(f"{path}: no JSON line (the output of benchmarks/mpi_forecast.py?)")
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="files holding the output of benchmarks/mpi_forecast.py")
    args = ap.parse_args()
    machine = load_machine("local")
    calibration, host_costs = stored_models(machine)
    rows = []
    print(f"{'run':<5}{'distribution':<13}{'tiling':<14}{'bg':>5}{'meas ms':>9}{'recorded':>9}{'err %':>7}"
          f"{'flat':>9}{'err %':>7}{'now':>9}{'err %':>7}")
    for i, path in enumerate(args.runs):
        doc = last_json(path)
        cfg = load_model(doc["model"])
        net = network_or_error(machine, 2, 1)
        for r in doc["rows"]:
            if not r.get("runs_s"):
                continue
            tiling = Tiling.parse(r["tiling"])
            kw = dict(progress=doc.get("progress", "auto"), background=r["background_threads"])
            ranks = len(r["busy_predicted_s"])
            before = r["pred_step_s"]
            flat = forecast_ranks(cfg, doc["batch"], doc["seq"], tiling, doc["sched"], ranks, r["distribution"],
                                  machine, calibration, host_costs, net, 1, submit_roles=False, message_cpu=False,
                                  **kw).step_s
            now = forecast_ranks(cfg, doc["batch"], doc["seq"], tiling, doc["sched"], ranks, r["distribution"],
                                 machine, calibration, host_costs, net, 1, **kw).step_s
            meas = r["step_s"]
            row = dict(run=path, distribution=r["distribution"], tiling=r["tiling"], background=r["background_threads"],
                       step_s=meas, before_s=before, flat_s=flat, now_s=now, error_before=(before - meas) / meas,
                       error_flat=(flat - meas) / meas, error_now=(now - meas) / meas)
            rows.append(row)
            print(f"{i:<5}{r['distribution']:<13}{r['tiling']:<14}{r['background_threads']:>5.1f}{meas * 1e3:>9.1f}"
                  f"{before * 1e3:>9.1f}{100 * row['error_before']:>7.1f}{flat * 1e3:>9.1f}{100 * row['error_flat']:>7.1f}"
                  f"{now * 1e3:>9.1f}{100 * row['error_now']:>7.1f}", flush=True)
    eb = np.abs([r["error_before"] for r in rows])
    en = np.abs([r["error_now"] for r in rows])
    print(f"within 10%: recorded {int((eb <= 0.1).sum())} of {len(rows)}, now {int((en <= 0.1).sum())} of {len(rows)}; "
          f"median |error|: recorded {100 * np.median(eb):.0f}%, now {100 * np.median(en):.0f}%", file=sys.stderr)
    print(json.dumps({"rows": rows, "within_10pct_before": int((eb <= 0.1).sum()),
                      "within_10pct_now": int((en <= 0.1).sum()), "median_abs_error_before": float(np.median(eb)),
                      "median_abs_error_now": float(np.median(en))}))


if __name__ == "__main__":
    main()
