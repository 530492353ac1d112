"""Fit the numbers of each serving-engine profile to the calibration rows of its source.

For each engine of ``inference_engines.yaml`` the figures listed in ``FITTED``
minimise the sum of squared log errors (predicted / published) over the rows
of ``validation/inference.yaml`` whose source is that engine and whose role is
``calibration`` (Nelder-Mead; fractions are searched through a logistic map,
seconds through a log map, so they stay in range). Every other figure of the
profile is stated in the YAML file. The validation rows are never read.

``python3 -m tilecast.cluster.inference_calibrate`` prints the fitted figures
as YAML; with ``--write`` it also writes them (and the rows, in ``sources``)
into ``inference_engines.yaml``, keeping its comments.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import replace

import numpy as np
import yaml
from scipy.optimize import minimize

from tilecast.cluster.hardware import load_cluster
from tilecast.cluster.inference_costs import ENGINES_FILE, load_engines
from tilecast.cluster.inference_validation import load_inference_runs, predict_inference

# engine -> figures fitted on its calibration rows (the rest of its profile is stated)
FITTED = {
    "trtllm-0.6": ("decode_hbm_efficiency", "kv_group_reread", "fp8_matmul_scale"),
    "trtllm-0.5": ("pass_overhead_s", "collective_overhead_s"),
    "trtllm-0.9": ("decode_hbm_efficiency", "kv_group_reread", "fp8_matmul_scale"),
    "trtllm-0.9-gqa": ("kv_group_reread",),
    "trtllm-0.9-ttft": ("pass_overhead_s", "collective_overhead_s"),
    "nemo": ("layer_overhead_s", "collective_overhead_s"),
    "argonne-trtllm": ("layer_overhead_s", "collective_overhead_s", "kv_group_reread"),
    "argonne-vllm": ("layer_overhead_s", "collective_overhead_s", "kv_group_reread"),
}
# engine -> the engine whose fitted figures it takes over before its own are fitted
INHERITS = {"trtllm-0.5": "trtllm-0.6", "trtllm-0.9-ttft": "trtllm-0.9", "trtllm-0.9-gqa": "trtllm-0.9", "nemo": "trtllm-0.6", "argonne-trtllm": "trtllm-0.6",
            "argonne-vllm": "trtllm-0.6"}
# of an engine's parent figures, the ones it takes (default: all of the parent's fitted ones it does not fit)
TAKES = {"nemo": ("decode_hbm_efficiency",), "argonne-trtllm": ("decode_hbm_efficiency",),
         "argonne-vllm": ("decode_hbm_efficiency",)}
FRACTIONS = ("decode_hbm_efficiency", "kv_group_reread")


def _to_x(name, v):
    if name in FRACTIONS:
        v = min(max(v, 1e-4), 1 - 1e-4)
        return math.log(v / (1 - v))
    return math.log(max(v, 1e-9))


def _from_x(name, x):
    return 1.0 / (1.0 + math.exp(-x)) if name in FRACTIONS else math.exp(x)


def fit_engine(engine: str, runs=None, engines=None, clusters=None) -> tuple:
    """(fitted profile, calibration rows used, RMS log error) for one engine."""
    engines = engines or load_engines()
    runs = load_inference_runs() if runs is None else runs
    rows = [r for r in runs if r.engine == engine and r.role == "calibration"]
    if not rows:
        raise ValueError(f"engine: no calibration rows for {engine}")
    clusters = clusters or {r.cluster: load_cluster(r.cluster) for r in rows}
    names = FITTED[engine]
    base = engines[engine]

    def profile(x):
        return replace(base, **{n: _from_x(n, v) for n, v in zip(names, x)})

    def loss(x):
        p = profile(x)
        return sum(math.log(predict_inference(r, clusters, {engine: p}) / r.published) ** 2 for r in rows)

    x0 = np.array([_to_x(n, getattr(base, n) or 1e-5) for n in names])
    res = minimize(loss, x0, method="Nelder-Mead", options={"xatol": 1e-4, "fatol": 1e-10, "maxiter": 2000})
    best = profile(res.x)
    return best, [r.id for r in rows], math.sqrt(res.fun / len(rows))


def write_engines(fitted: dict, path: str = ENGINES_FILE) -> None:
    """Replace the values of the fitted fields (and ``sources``) in the engines file, line by line."""
    with open(path) as f:
        lines = f.read().split("\n")
    engine = None
    for i, line in enumerate(lines):
        m = re.match(r"^  ([\w.-]+):", line)
        if m:
            engine = m.group(1)
            continue
        m = re.match(r"^(    (\w+): )([^#]*?)(\s*#.*)?$", line)
        if engine in fitted and m and m.group(2) in fitted[engine]:
            v = fitted[engine][m.group(2)]
            lines[i] = f"{m.group(1)}{v}{m.group(4) or ''}"
    with open(path, "w") as f:
        f.write("\n".join(lines))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out, engines = {}, load_engines()
    for engine in FITTED:  # parents come first
        parent = INHERITS.get(engine)
        if parent:
            names = TAKES.get(engine) or [n for n in FITTED[parent] if n not in FITTED[engine]]
            take = {n: getattr(engines[parent], n) for n in names}
            engines[engine] = replace(engines[engine], **take)
            out.setdefault(engine, {}).update({n: float(f"{v:.4g}") for n, v in take.items()})
        prof, ids, rms = fit_engine(engine, engines=engines)
        engines[engine] = prof
        out.setdefault(engine, {}).update({n: float(f"{getattr(prof, n):.4g}") for n in FITTED[engine]})
        out[engine]["sources"] = ", ".join(ids)
        print(f"# {engine}: RMS log error {rms:.4f} over {len(ids)} calibration rows", file=sys.stderr)
    print(yaml.safe_dump(out, sort_keys=False), end="")
    if "--write" in argv:
        write_engines(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
