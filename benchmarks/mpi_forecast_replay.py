"""The rank forecast again on measurements already taken: each row of earlier ``mpi_forecast.py`` runs
predicted anew with the model as it is now, with the same background threads the run measured, against the
same measured step; beside it the forecast the run itself printed (``recorded``: the model and calibration
of that day) and the model now with one CPU time per submitted task and no CPU per message on the progress
threads (``flat``: ``forecast_ranks(..., submit_roles=False, message_cpu=False)``), and the model now with the
main thread given half its rank's slots while it submits (``even``: ``submit_share=False``) instead of the
probe's measured part (``Network.submit_share``). Where the run read its ranks' threads (``thread_cpu``), also
``during``: the model now with the background threads that leave each rank thread the share of a core the
ranks' threads had during the runs (their CPU over the step, :func:`realized_share`) instead of the share
measured before them: what the forecast would say had it known the other work of those seconds (a check of the
model's structure, not a forecast).

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


def realized_share(row: dict) -> float | None:
    """The share of a core each rank thread had during the row's runs: per run, the ranks' main and worker
    threads' seconds on a core over the run's step, per rank (a rank keeps one thread busy, the two share it),
    averaged over the ranks; the median over the runs. None without thread readings."""
    got = [np.mean([(g["main"][0] + g["worker"][0]) / step for g in run])
           for run, step in zip(row.get("thread_cpu") or [], row.get("runs_s") or []) if step > 0]
    return float(np.median(got)) if got else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="files holding the output of benchmarks/mpi_forecast.py")
    args = ap.parse_args()
    machine = load_machine("local")
    calibration, host_costs = stored_models(machine)
    rows = []
    print(f"{'run':<5}{'distribution':<13}{'tiling':<14}{'bg':>5}{'meas ms':>9}{'recorded':>9}{'err %':>7}"
          f"{'flat':>9}{'err %':>7}{'even':>9}{'err %':>7}{'now':>9}{'err %':>7}{'share':>7}{'during':>9}{'err %':>7}")
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
            even = forecast_ranks(cfg, doc["batch"], doc["seq"], tiling, doc["sched"], ranks, r["distribution"],
                                  machine, calibration, host_costs, net, 1, submit_share=False, **kw).step_s
            now = forecast_ranks(cfg, doc["batch"], doc["seq"], tiling, doc["sched"], ranks, r["distribution"],
                                 machine, calibration, host_costs, net, 1, **kw).step_s
            meas = r["step_s"]
            real = realized_share(r)
            during = None
            if real is not None:
                from tilecast.loop.ranks_load import background_from_share

                bg = background_from_share(min(real, 1.0), ranks, int(machine.meta["hardware"]["cores"]))
                during = forecast_ranks(cfg, doc["batch"], doc["seq"], tiling, doc["sched"], ranks, r["distribution"],
                                        machine, calibration, host_costs, net, 1, progress=kw["progress"],
                                        background=bg).step_s
            row = dict(run=path, distribution=r["distribution"], tiling=r["tiling"], background=r["background_threads"],
                       step_s=meas, before_s=before, flat_s=flat, even_s=even, now_s=now,
                       error_before=(before - meas) / meas, error_flat=(flat - meas) / meas,
                       error_even=(even - meas) / meas, error_now=(now - meas) / meas,
                       share_before=(r.get("other_work") or {}).get("share"), share_during=real, during_s=during,
                       error_during=None if during is None else (during - meas) / meas)
            rows.append(row)
            print(f"{i:<5}{r['distribution']:<13}{r['tiling']:<14}{r['background_threads']:>5.1f}{meas * 1e3:>9.1f}"
                  f"{before * 1e3:>9.1f}{100 * row['error_before']:>7.1f}{flat * 1e3:>9.1f}{100 * row['error_flat']:>7.1f}"
                  f"{even * 1e3:>9.1f}{100 * row['error_even']:>7.1f}{now * 1e3:>9.1f}{100 * row['error_now']:>7.1f}"
                  + (f"{real:>7.2f}{during * 1e3:>9.1f}{100 * row['error_during']:>7.1f}" if during is not None else ""),
                  flush=True)
    eb = np.abs([r["error_before"] for r in rows])
    en = np.abs([r["error_now"] for r in rows])
    ee = np.abs([r["error_even"] for r in rows])
    ed = np.abs([r["error_during"] for r in rows if r["error_during"] is not None])
    if len(ed):
        print(f"with the share during the runs: {int((ed <= 0.1).sum())} of {len(ed)} within 10%, "
              f"median |error| {100 * np.median(ed):.0f}%", file=sys.stderr)
    print(f"within 10%: recorded {int((eb <= 0.1).sum())} of {len(rows)}, now {int((en <= 0.1).sum())} of {len(rows)}; "
          f"median |error|: recorded {100 * np.median(eb):.0f}%, now {100 * np.median(en):.0f}%; "
          f"even split: {int((ee <= 0.1).sum())} within 10%, median |error| {100 * np.median(ee):.0f}%", file=sys.stderr)
    print(json.dumps({"rows": rows, "within_10pct_before": int((eb <= 0.1).sum()),
                      "within_10pct_now": int((en <= 0.1).sum()), "within_10pct_even": int((ee <= 0.1).sum()),
                      "median_abs_error_even": float(np.median(ee)), "median_abs_error_before": float(np.median(eb)),
                      "median_abs_error_now": float(np.median(en))}))


if __name__ == "__main__":
    main()
