"""Fit the fitted figures of the cluster descriptions to published runs.

Per cluster description (GPU), the figures fitted are:

- the plateau ``e_max`` of the GEMM efficiency curve, one per GPU, as a fraction of each dtype's
  datasheet peak: bf16, fp16 and fp8 share it (``e_max.bf16``). An fp8 product's own extra work, the
  casts of its operands, is costed apart from the curve (:mod:`tilecast.cluster.fp8_costs`), so the
  tensor cores are taken to reach the same fraction of their peak in either precision; an fp8 row then
  informs the bf16 curve and the reverse (with its own fp8 plateau, a fit without bf16 rows of a GPU
  left that GPU's bf16 curve at its prior). The curve's shape in the flops of one
  call is fixed: efficiency(F) = e_max x F / (F + 2 GFLOP), tabulated at decades
  from 1e8 to 1e13 (a 1024^3 GEMM reaches half the plateau, an assumption; the
  rows all run GEMMs of 1e11 flops or more, so they cannot pin it);
- ``gemm_half_dim``: the smallest GEMM dimension at which the shape factor
  d / (d + d_half) is one half (``hardware.GPU.shape_factor``);
- the efficiency of the fused attention kernels, on the causal flops
  (``flops.causal_fraction``): FlashAttention-2's (``attention.flash``) is
  searched as a fraction of the peak (at most 1: a kernel may beat the
  end-to-end GEMM curve, not the peak); cuDNN's Hopper kernel, of
  FlashAttention-3's generation, runs a stated ratio faster
  (:data:`ATTENTION_RATIOS`), so rows of either kernel fit one figure; both are
  stored relative to the bf16 curve, as ``hardware.GPU.attention_efficiency``.

They minimise the sum of squared log errors of the predicted metric over the
rows given (``scipy.optimize.least_squares``, bounded). A figure that no given
row depends on keeps its prior (:data:`PRIORS`): that happens in the
leave-one-publication-out folds, where a fit sees the other publications only.

``python3 -m tilecast.cluster.calibrate`` fits the ``role: calibration`` rows
and prints the figures written into the cluster YAML files (marked [CAL]);
``--lopo`` refits once per publication on all rows of the other publications and
writes the folds' figures to ``validation/lopo.yaml``, which ``tilecast validate``
uses to print the leave-one-publication-out error.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from dataclasses import replace

import numpy as np
import yaml
from scipy.optimize import least_squares

from tilecast.cluster.hardware import EfficiencyCurve, load_cluster
from tilecast.cluster.validation import RUNS, load_runs, predict

DECADES = tuple(10.0 ** k for k in range(8, 14))
F_HALF = 2e9
# dtypes that share one fitted plateau (a fraction of each one's peak; fp8's casts are costed apart)
CURVE_GROUPS = {"bf16": ("bf16", "fp16", "fp8")}
LOPO_FILE = os.path.join(os.path.dirname(__file__), "validation", "lopo.yaml")
# Publications whose rows no fit ever sees, the leave-one-publication-out folds of the other publications
# included: rows added after the figures were fitted, predicted as they come (Megatron-Bridge's mixtures of
# experts). Their own fold is the fit on every other row.
NEVER_FITTED = ("mbridge",)
# Figures a fit starts from, and keeps when no row it is given depends on them. Attention figures here
# are fractions of the peak (fitted figures are stored relative to the GEMM curve, see fit_cluster).
#   e_max bf16: Maximum Achievable Matmul FLOPS, S. Bekman, "Machine Learning Engineering",
#     compute/accelerator/README.md (A100 SXM 267.9 of 312 TFLOPS = 0.859, H100 SXM 792.1 of 989 = 0.801);
#   attention.flash: A100 0.6, within "50-73% of the theoretical maximum FLOPs/s on A100" (Dao 2023,
#     FlashAttention-2, abstract); H100 0.35, "only 35% utilization on the H100" for FlashAttention-2
#     (Shah et al. 2024, FlashAttention-3, abstract);
#   gemm_half_dim: [ASSUMED]; attention.cudnn: derived (ATTENTION_RATIOS), its value here unused.
PRIORS = {
    "dgx-a100": {"e_max.bf16": 0.859, "attention.flash": 0.6, "gemm_half_dim": 256.0},
    "dgx-h100": {"e_max.bf16": 0.801, "attention.flash": 0.35, "attention.cudnn": 0.525, "gemm_half_dim": 256.0},
}
# kernel -> (the kernel it is tied to, speed ratio). Not fitted: cuDNN's fused attention on Hopper against
# FlashAttention-2 on the same H100, in FlashAttention-3's own benchmarks (Shah et al. 2024, arXiv:2407.08608,
# "Attention backward speed" figures, H100 SXM5, bf16): head dim 128, 305 vs 214 TFLOP/s at sequence 512 up to
# 518 vs 318 at 8k (1.43-1.63x); head dim 64, 1.34x at 512 to 1.50x at 2k. 1.5 is taken for every sequence
# (the rows run 2048-32768 with head dims 64-128); the abstract's "1.5-2.0x" is FlashAttention-3's own gain.
ATTENTION_RATIOS = {"cudnn": ("flash", 1.5)}
# A fused attention kernel may run faster than the end-to-end GEMM curve (which carries a framework's
# overheads, and which cuDNN's and FlashAttention-3's Hopper kernels beat), never faster than the peak:
# attention figures are fitted as fractions of the peak, so the bound is attention x plateau <= 1.
BOUNDS = {"e_max": (0.05, 1.0), "attention": (0.02, 1.0), "gemm_half_dim": (0.0, 8192.0)}  # attention: of the peak


def curve(e_max: float, f_half: float = F_HALF) -> EfficiencyCurve:
    xs = np.array(DECADES)
    return EfficiencyCurve(tuple(xs), tuple(np.round(e_max * xs / (xs + f_half), 4)))


def apply(cluster, params: dict):
    """A copy of ``cluster`` with the figures of ``params`` (``e_max.<group>``, ``attention.<kernel>``,
    ``gemm_half_dim``) set."""
    gpu = cluster.gpu
    eff, att = dict(gpu.matmul_efficiency), dict(gpu.attention_efficiency)
    half = gpu.gemm_half_dim
    for key, v in params.items():
        kind, _, what = key.partition(".")
        if kind == "e_max":
            for dt in CURVE_GROUPS[what]:
                if dt in eff:
                    eff[dt] = curve(v)
        elif kind == "attention":
            att[what] = v
        else:
            half = v
    return replace(cluster, gpu=replace(gpu, matmul_efficiency=eff, attention_efficiency=att, gemm_half_dim=half))


def used_params(runs) -> set:
    """The figures the given rows depend on."""
    out = set()
    for r in runs:
        s = r.strategy
        out.add("e_max.bf16")  # every dtype's plateau (CURVE_GROUPS); attention runs in bf16 next to fp8 GEMMs
        if s.attention != "unfused":
            out.add("attention." + ATTENTION_RATIOS.get(s.attention, (s.attention,))[0])
        out.add("gemm_half_dim")
    return out


def fit_cluster(cluster_name: str, runs) -> dict:
    """Figures of one cluster fitted on ``runs`` (rows of that cluster); priors for the others."""
    prior = dict(PRIORS[cluster_name])
    rows = [r for r in runs if r.cluster == cluster_name]
    tied = {f"attention.{k}": (f"attention.{to}", r) for k, (to, r) in ATTENTION_RATIOS.items()
            if f"attention.{k}" in prior}
    free = sorted(k for k in prior if k in used_params(rows) and k not in tied)
    base = load_cluster(cluster_name)
    lo = [BOUNDS[k.split(".")[0]][0] for k in free]
    hi = [BOUNDS[k.split(".")[0]][1] / max([r for to, r in tied.values() if to == k], default=1.0)
          for k in free]  # a tied kernel stays within the peak too
    scale = np.array([1000.0 if k == "gemm_half_dim" else 1.0 for k in free])

    def params_of(x):
        # attention figures are searched as fractions of the peak (at most 1) and stored relative to the curve
        p = {**prior, **dict(zip(free, x * scale))}
        for k, (to, ratio) in tied.items():
            p[k] = ratio * p[to]
        for k in p:
            if k.startswith("attention."):
                p[k] = p[k] / p["e_max.bf16"]
        return p

    if not rows or not free:
        return {"params": {k: round(float(v), 4) for k, v in params_of(np.array([])).items()},
                "rows": [r.id for r in rows], "rms_log_error": None}

    def residuals(x):
        c = apply(base, params_of(x))
        return np.array([np.log(predict(r, {cluster_name: c}) / r.published) for r in rows])

    x0 = np.clip([prior[k] for k in free], lo, hi) / scale
    res = least_squares(residuals, x0, bounds=(np.array(lo) / scale, np.array(hi) / scale), diff_step=1e-3,
                        xtol=1e-4, ftol=1e-6)
    params = {k: round(float(v), 0 if k.startswith("gemm") else 4) for k, v in params_of(res.x).items()}
    return {"params": params, "rows": [r.id for r in rows],
            "rms_log_error": float(np.sqrt(np.mean(res.fun ** 2)))}


def fit(runs) -> dict:
    """cluster name -> fit of :func:`fit_cluster`, for every cluster with priors."""
    return {name: fit_cluster(name, runs) for name in PRIORS}


def fitted_clusters(fits: dict) -> dict:
    """cluster name -> Cluster with the fitted figures (dgx-h200 takes dgx-h100's: same die)."""
    out = {name: apply(load_cluster(name), f["params"]) for name, f in fits.items()}
    if "dgx-h100" in fits:
        out["dgx-h200"] = apply(load_cluster("dgx-h200"), fits["dgx-h100"]["params"])
    return out


def table_digest(path: str = RUNS) -> str:
    """A digest of the validation table and of the shapes of the models its rows name (a preset changed
    under an unchanged table changes the fits too), so that stale folds are noticed."""
    from tilecast.graph.model_config import load_model

    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    for name in sorted({r.model for r in load_runs(path)}):
        h.update(json.dumps(load_model(name).to_dict(), sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def fittable(runs) -> list:
    """The rows a fit may see: all but those of :data:`NEVER_FITTED` publications."""
    return [r for r in runs if r.source not in NEVER_FITTED]


def lopo_fits(runs) -> dict:
    """Publication -> figures fitted on all rows of the other publications (never those of
    :data:`NEVER_FITTED`)."""
    return {src: fit([r for r in fittable(runs) if r.source != src]) for src in sorted({r.source for r in runs})}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m tilecast.cluster.calibrate", description=__doc__.split("\n")[0])
    ap.add_argument("--lopo", action="store_true", help="refit the leave-one-publication-out folds and write "
                                                        + os.path.relpath(LOPO_FILE))
    args = ap.parse_args(argv)
    runs = load_runs()
    if args.lopo:
        folds = lopo_fits(runs)
        doc = {"table_sha256_16": table_digest(),
               "folds": {src: {name: f["params"] for name, f in fits.items()} for src, fits in folds.items()}}
        with open(LOPO_FILE, "w") as f:
            f.write("# Leave-one-publication-out folds: the fitted figures of each cluster description when\n"
                    "# the publication named is left out and every row of the others is fitted.\n"
                    "# Written by `python3 -m tilecast.cluster.calibrate --lopo`; read by `tilecast validate`.\n")
            yaml.safe_dump(doc, f, sort_keys=True)
        print(json.dumps(doc))
        return 0
    for name, f in fit([r for r in fittable(runs) if r.role == "calibration"]).items():
        print(json.dumps({"cluster": name, **f}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
