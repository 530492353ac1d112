"""Inference predictions against published measurements (``validation/inference.yaml``)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np
import yaml

from tilecast.cluster.hardware import load_cluster
from tilecast.cluster.inference import InferenceConfig, evaluate_inference
from tilecast.cluster.inference_costs import engine_efficiency, load_engines
from tilecast.graph.model_config import load_model

INFERENCE_RUNS = os.path.join(os.path.dirname(__file__), "validation", "inference.yaml")
METRICS = ("tokens_per_s_per_gpu", "tokens_per_s", "ttft_s", "tpot_s", "request_latency_s")
CONFIG_FIELDS = ("tp", "pp", "batch", "input_len", "output_len", "weight_dtype", "kv_dtype", "request_rate",
                 "max_batch")
REQUIRED = ("id", "source", "cluster", "model", "batch", "input_len", "output_len", "metric", "published", "role")


class InferenceTableError(ValueError):
    pass


@dataclass
class InferenceRun:
    id: str
    source: str
    cluster: str
    model: object  # a preset name or a shape mapping
    metric: str
    published: float
    role: str
    config: InferenceConfig
    assumed: tuple = ()
    engine_profile: str = ""  # a row's own engine profile, when it differs from its source's

    @property
    def engine(self) -> str:
        """The engine profile of ``inference_engines.yaml`` it is predicted with: the row's ``engine``
        field, else the one named as its source."""
        return self.engine_profile or self.source


def load_inference_runs(path: str = INFERENCE_RUNS) -> list:
    """The rows of an inference validation table, each checked."""
    with open(path) as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise InferenceTableError(f"{path}: expected a mapping with a list of runs")
    defaults, models = data.get("defaults") or {}, data.get("models") or {}
    runs = []
    for i, row in enumerate(data["runs"]):
        r = {**defaults, **row}
        for k in REQUIRED:
            if k not in r:
                raise InferenceTableError(f"{path}: run {r.get('id', i)} lacks field {k}")
        if r["metric"] not in METRICS:
            raise InferenceTableError(f"{path}: run {r['id']}: metric must be one of {', '.join(METRICS)}")
        if r["role"] not in ("calibration", "validation"):
            raise InferenceTableError(f"{path}: run {r['id']}: role must be calibration or validation")
        model = r["model"]
        if model in models:
            model = {"name": model, **models[model]}
        runs.append(InferenceRun(id=r["id"], source=r["source"], cluster=r["cluster"], model=model,
                                 metric=r["metric"], published=float(r["published"]), role=r["role"],
                                 config=InferenceConfig(**{k: r[k] for k in CONFIG_FIELDS if k in r}),
                                 assumed=tuple(r.get("assumed", ())), engine_profile=str(r.get("engine", ""))))
    return runs


def _shape(model):
    return load_model(json.dumps(model) if isinstance(model, dict) else model)


def predict_inference(run: InferenceRun, clusters: dict | None = None, efficiencies: dict | None = None) -> float:
    clusters = clusters if clusters is not None else {}
    c = clusters.get(run.cluster) or load_cluster(run.cluster)
    eff = (efficiencies or {}).get(run.engine) or engine_efficiency(run.engine)
    res = evaluate_inference(_shape(run.model), run.config, c, eff)
    return float(getattr(res, run.metric))


def compare_inference(runs=None, clusters: dict | None = None, efficiencies: dict | None = None):
    """A DataFrame: id, source, role, cluster, tp, metric, published, predicted, error (predicted / published - 1,
    as ``tilecast validate`` counts training rows: for times, positive = predicted slower)."""
    import pandas as pd

    runs = load_inference_runs() if runs is None else runs
    clusters = {} if clusters is None else clusters
    efficiencies = {**load_engines(), **(efficiencies or {})}  # read the engines file once
    rows = []
    for r in runs:
        clusters.setdefault(r.cluster, load_cluster(r.cluster))
        pred = predict_inference(r, clusters, efficiencies)
        err = pred / r.published - 1.0
        rows.append({"id": r.id, "source": r.source, "engine": r.engine, "role": r.role, "cluster": r.cluster,
                     "tp": r.config.tp,
                     "metric": r.metric, "published": r.published, "predicted": pred, "error": err})
    return pd.DataFrame(rows)


def median_abs_error(df) -> float:
    return float(np.median(np.abs(df["error"]))) if len(df) else float("nan")
