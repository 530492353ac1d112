"""Fit a cluster's matmul-efficiency plateau and fused-attention efficiency to the
``calibration`` rows of the validation table.

The curve is a saturating function of the work of one GEMM call F:
efficiency(F) = e_max x F / (F + F_half), tabulated at decades from 1e8 to 1e13
flops. Its shape is fixed (F_half = 2 GFLOP: a 1024^3 GEMM reaches half the
plateau, an assumption; the calibration rows all run GEMMs of 1e11 flops or
more, so they cannot pin the shape). For each (cluster, GEMM dtype) the plateau
``e_max`` and the efficiency of the attention kernel those rows use (relative to
the curve) minimise the sum of squared log errors of the predicted throughput
over the matching calibration rows (Nelder-Mead).

``python3 -m tilecast.cluster.calibrate`` prints the fitted figures, which are
then written into the cluster's YAML file (marked [CAL] with the row ids).
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
F_HALF = 2e9
# dtypes that share one fitted curve
CURVE_GROUPS = {"bf16": ("bf16", "fp16"), "fp8": ("fp8",)}


def curve(e_max: float, f_half: float = F_HALF) -> EfficiencyCurve:
    xs = np.array(DECADES)
    return EfficiencyCurve(tuple(xs), tuple(np.round(e_max * xs / (xs + f_half), 4)))


def with_fit(cluster, dtype: str, e_max: float, kernel: str, attention: float):
    gpu = cluster.gpu
    eff = dict(gpu.matmul_efficiency)
    for dt in CURVE_GROUPS[dtype]:
        if dt in eff:
            eff[dt] = curve(e_max)
    att = dict(gpu.attention_efficiency)
    att[kernel] = attention
    return replace(cluster, gpu=replace(gpu, matmul_efficiency=eff, attention_efficiency=att))


def groups(runs=None) -> list:
    """(cluster, dtype, attention kernel) of every group of calibration rows."""
    runs = runs or load_runs()
    return sorted({(r.cluster, r.strategy.dtype, r.strategy.attention) for r in runs if r.role == "calibration"})


def fit(cluster_name: str, dtype: str, kernel: str, runs=None) -> dict:
    rows = [r for r in (runs or load_runs()) if r.role == "calibration" and r.cluster == cluster_name
            and r.strategy.dtype == dtype and r.strategy.attention == kernel]
    if not rows:
        raise ValueError(f"no calibration rows for {cluster_name} {dtype} {kernel}")
    base = load_cluster(cluster_name)

    def loss(x):
        e_max, att = x
        if not (0.05 < e_max <= 1.0 and 0.05 < att <= 1.0):
            return 1e9
        c = with_fit(base, dtype, e_max, kernel, att)
        return float(sum(np.log(predict(r, {cluster_name: c}) / r.published) ** 2 for r in rows))

    best = minimize(loss, x0=[0.6, 0.6], method="Nelder-Mead",
                    options={"xatol": 1e-3, "fatol": 1e-7, "maxiter": 300})
    e_max, att = best.x
    cv = curve(e_max)
    return {"cluster": cluster_name, "dtype": dtype, "attention_kernel": kernel, "rows": [r.id for r in rows],
            "e_max": round(float(e_max), 4), "attention_efficiency": round(float(att), 3),
            "points": [[x, y] for x, y in zip(cv.flops, cv.fraction)],
            "rms_log_error": float(np.sqrt(best.fun / len(rows)))}


def main(argv=None) -> int:
    for cl, dt, k in groups():
        print(json.dumps(fit(cl, dt, k)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
