"""Sweeps of a serving configuration: one hardware figure or one serving parameter varied.

The hardware parameters are the training sweeps' (:mod:`tilecast.cluster.sweep`, after MAD Max): each
row carries ``exposed_comm_share``, the tensor-parallel communication's share of the serving time (it
blocks the compute stream in serving engines, so all of it is exposed), and a ``note`` when the
configuration no longer fits in memory."""

from __future__ import annotations

from dataclasses import replace

from tilecast.cluster.inference import InferenceConfig, InferenceError, evaluate_inference
from tilecast.cluster.hardware import ClusterError
from tilecast.cluster.sweep import HARDWARE, HARDWARE_PARAMS, HARDWARE_SET, fit_note, hardware_point

# Serving what-ifs: InferenceConfig fields, parsed as these types.
CONFIG = {"tp": int, "pp": int, "dp": int, "batch": int, "input_len": int, "output_len": int, "weight_dtype": str,
          "kv_dtype": str, "request_rate": float, "max_batch": int,
          "ep": int, "cp": int, "expert_imbalance": float, "capacity_factor": float}
INFERENCE_PARAMS = HARDWARE_PARAMS + sorted(CONFIG)


def parse_inference_values(param: str, text: str) -> list:
    """``hbm_bw=x0.5..x4`` doubles from 0.5 to 4; otherwise a comma-separated list of the field's type."""
    from tilecast.cluster.sweep import parse_values

    if param in HARDWARE or param in HARDWARE_SET:
        return parse_values(param, text)
    return [CONFIG[param](v.strip()) for v in text.split(",") if v.strip()]


def inference_sweep(shape, cfg: InferenceConfig, cluster, param: str, values: list, engine) -> list:
    """Rows ``{value, result}`` or ``{value, error}`` (a value the configuration cannot take)."""
    rows = []
    for v in values:
        c, k = cluster, cfg
        if param in HARDWARE or param in HARDWARE_SET:
            try:
                c = hardware_point(cluster, param, v)
            except ClusterError as e:
                rows.append({"value": v, "error": str(e)})
                continue
        else:
            k = replace(cfg, **{param: v})
        try:
            rows.append({"value": v, "result": evaluate_inference(shape, k, c, engine)})
        except InferenceError as e:
            rows.append({"value": v, "error": str(e)})
    return rows


def inference_sweep_table(param: str, rows: list):
    """The rows as a DataFrame: throughput, latencies (s), breakdown (s), the communication share of the time,
    memory per GPU (bytes), fit, ``note`` (what it would need when it does not fit); ``error`` on rows without
    a result."""
    import pandas as pd

    table = []
    for row in rows:
        r = row.get("result")
        rec = {param: row["value"]}
        if r is None:
            rec["error"] = row["error"]
        else:
            rec.update(tokens_per_s=r.tokens_per_s, tokens_per_s_per_gpu=r.tokens_per_s_per_gpu, ttft_s=r.ttft_s,
                       tpot_s=r.tpot_s, batch=r.batch, max_batch=r.max_batch,
                       **{k: v for k, v in r.breakdown.items() if k != "total_s"},
                       exposed_comm_share=r.breakdown["comm_s"] / r.breakdown["total_s"] if r.breakdown["total_s"] else 0.0,
                       memory_per_gpu_bytes=r.memory_per_gpu_bytes, fits=r.fits, overloaded=r.overloaded,
                       note=fit_note(r.fits, r.memory_per_gpu_bytes, r.memory_capacity_bytes))
        table.append(rec)
    return pd.DataFrame(table)


INFERENCE_PARTS = ("compute_s", "memory_s", "comm_s", "overhead_s", "pipeline_idle_s")
