"""Fit a cluster's matmul-efficiency curve to the ``calibration`` rows of the validation table.

The curve is a saturating function of the work of one GEMM call F:
efficiency(F) = e_max x F / (F + F_half), tabulated at decades from 1e8 to 1e13
flops. Its shape is fixed (F_half = 2 GFLOP: a 1024^3 GEMM reaches half the
plateau, an assumption; the calibration rows all run GEMMs of 1e11 flops or
more, so they cannot pin the shape). The plateau ``e_max`` and the fused
attention efficiency (relative to the curve) minimise the sum of squared log
errors of the predicted throughput over the calibration rows of that cluster
(Nelder-Mead).
Run ``python3 -m tilecast.cluster.calibrate`` to print the fitted points, which
are then written into the cluster's YAML file (marked [CAL]).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import numpy as np
from scipy.optimize import minimize

from tilecast.cluster.hardware import EfficiencyCurve, load_cluster
from tilecast.cluster.validation import load_runs, predict

DECADES = tuple(10.0 ** k for k in range(8, 14))


def curve(e_max: float, f_half: float, dtype_scale: float = 1.0) -> EfficiencyCurve:
    xs = np.array(DECADES)
    return EfficiencyCurve(tuple(xs), tuple(np.round(dtype_scale * e_max * xs / (xs + f_half), 4)))


F_HALF = 2e9


def with_curve(cluster, e_max: float, f_half: float = F_HALF, attention: float = None):
    gpu = cluster.gpu
    if attention is not None:
        gpu = replace(gpu, attention_efficiency=attention)
    eff = dict(gpu.matmul_efficiency)
    for dt in ("bf16", "fp16"):
        if dt in eff:
            eff[dt] = curve(e_max, f_half)
    return replace(cluster, gpu=replace(gpu, matmul_efficiency=eff))


def fit(cluster_name: str, runs=None) -> dict:
    runs = [r for r in (runs or load_runs()) if r.cluster == cluster_name and r.role == "calibration"]
    if not runs:
        raise ValueError(f"no calibration rows for {cluster_name}")
    base = load_cluster(cluster_name)

    def loss(x):
        e_max, att = x
        if not (0.05 < e_max <= 1.0 and 0.05 < att <= 1.0):
            return 1e9
        c = with_curve(base, e_max, F_HALF, att)
        errs = [np.log(predict(r, {cluster_name: c}) / r.published) for r in runs]
        return float(np.sum(np.square(errs)))

    best = minimize(loss, x0=[0.75, 0.6], method="Nelder-Mead", options={"xatol": 1e-3, "fatol": 1e-6, "maxiter": 200})
    e_max, att = best.x
    cv = curve(e_max, F_HALF)
    return {"cluster": cluster_name, "rows": [r.id for r in runs], "e_max": round(float(e_max), 4),
            "attention_efficiency": round(float(att), 3), "points": [[x, y] for x, y in zip(cv.flops, cv.fraction)],
            "rms_log_error": float(np.sqrt(best.fun / len(runs)))}


def main(argv=None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or sorted({r.cluster for r in load_runs() if r.role == "calibration"})
    for n in names:
        res = fit(n)
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
