"""Predictions against published measurements of real training runs (``validation/runs.yaml``)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import yaml

from tilecast.cluster.evaluate import evaluate
from tilecast.cluster.hardware import load_cluster
from tilecast.cluster.strategy import Strategy
from tilecast.graph.model_config import load_model

RUNS = os.path.join(os.path.dirname(__file__), "validation", "runs.yaml")
METRICS = ("step_s", "tokens_per_s", "tflops_per_gpu")
STRATEGY_FIELDS = ("tp", "pp", "dp", "seq", "global_batch", "micro_batch", "zero", "schedule", "virtual_stages",
                   "recompute", "sequence_parallel", "attention", "overlap_grad_reduce", "overlap_param_gather",
                   "tp_comm_overlap", "grad_reduce_bytes", "dtype", "cp", "ep", "capacity_factor", "expert_imbalance",
                   "shard_group")
REQUIRED = ("id", "source", "cluster", "model", "gpus", "dp", "seq", "global_batch", "micro_batch", "metric",
            "published", "role")
# Publications that must stay out of the table and of every calibration.
EXCLUDED = ("narayanan", "korthikanti", "2104.04473", "2205.05198")


class ValidationTableError(ValueError):
    pass


@dataclass
class Run:
    id: str
    source: str
    cluster: str
    model: str
    gpus: int
    metric: str
    published: float
    role: str
    strategy: Strategy
    assumed: tuple = ()


def load_runs(path: str = RUNS) -> tuple:
    """(runs, sources text) from the YAML table, each row checked."""
    with open(path) as f:
        text = f.read()
    data = yaml.safe_load(text)
    defaults = data.get("defaults", {})
    runs = []
    for i, row in enumerate(data.get("runs", [])):
        r = {**defaults, **row}
        for v in r.values():
            if isinstance(v, str) and any(bad in v.lower() for bad in EXCLUDED):
                raise ValidationTableError(f"{path}: run {r.get('id', i)} cites {v!r}, a publication kept out of validation")
        for k in REQUIRED:
            if k not in r:
                raise ValidationTableError(f"{path}: run {row.get('id', i)} lacks field {k}")
        if r["metric"] not in METRICS:
            raise ValidationTableError(f"{path}: run {r['id']}: metric must be one of {', '.join(METRICS)}")
        if r["role"] not in ("calibration", "validation"):
            raise ValidationTableError(f"{path}: run {r['id']}: role must be calibration or validation")
        st = Strategy(**{k: r[k] for k in STRATEGY_FIELDS if k in r})
        if st.gpus != r["gpus"]:
            raise ValidationTableError(f"{path}: run {r['id']}: tp x cp x pp x dp = {st.gpus} but gpus = {r['gpus']}")
        runs.append(Run(id=r["id"], source=r["source"], cluster=r["cluster"], model=r["model"], gpus=r["gpus"],
                        metric=r["metric"], published=float(r["published"]), role=r["role"], strategy=st,
                        assumed=tuple(r.get("assumed", ()))))
    return runs


def predict(run: Run, clusters: dict = None) -> float:
    clusters = clusters if clusters is not None else {}
    c = clusters.get(run.cluster) or load_cluster(run.cluster)
    res = evaluate(load_model(run.model), run.strategy, c)
    return float(getattr(res, run.metric))


def compare(runs=None, clusters: dict = None):
    """A DataFrame: id, source, role, metric, published, predicted, error (predicted / published - 1)."""
    import pandas as pd

    runs = load_runs() if runs is None else runs
    rows = []
    for r in runs:
        pred = predict(r, clusters)
        rows.append({"id": r.id, "source": r.source, "role": r.role, "gpus": r.gpus, "metric": r.metric,
                     "published": r.published, "predicted": pred, "error": pred / r.published - 1.0})
    return pd.DataFrame(rows)


def median_abs_error(df) -> float:
    return float(np.median(np.abs(df["error"]))) if len(df) else float("nan")


def scorecard(df, lopo=None, target: float = 0.08, lopo_target: float = None, max_error: float = None) -> dict:
    """The figures ``tilecast validate`` passes or fails on; only held-out rows (role validation) count,
    and the leave-one-publication-out median and the worst held-out row when their targets are given.

    ``df``: :func:`compare`'s frame; ``lopo``: the same rows predicted by the leave-one-publication-out
    folds (:func:`tilecast.cluster.lopo.lopo_errors`) or None. Errors are fractions (predicted / published - 1).
    """
    held, fitted = df[df.role == "validation"], df[df.role == "calibration"]
    if held.empty:
        raise ValidationTableError("no held-out (role: validation) rows")
    worst = held.loc[held.error.abs().idxmax()]
    med_held = median_abs_error(held)
    med_lopo = median_abs_error(lopo) if lopo is not None else None
    ok = med_held <= target and (lopo_target is None or med_lopo is None or med_lopo <= lopo_target)
    if max_error is not None:
        ok = ok and abs(worst.error) <= max_error
    return {
        "median_abs_error_heldout": med_held, "heldout_rows": int(len(held)),
        "max_abs_error_heldout": float(abs(worst.error)), "worst_heldout": str(worst.id),
        "heldout_beyond_25pct": int((held.error.abs() > 0.25).sum()),
        "median_abs_error_fitted": median_abs_error(fitted), "fitted_rows": int(len(fitted)),
        "median_abs_error_lopo": med_lopo,
        "median_abs_error_lopo_by_source": ({s: median_abs_error(g) for s, g in lopo.groupby("source")}
                                            if lopo is not None else None),
        "target": target, "lopo_target": lopo_target, "max_error": max_error, "ok": bool(ok),
        "sources": sorted(set(df.source)),
    }
