"""Search serving layouts (TP x PP x DP on a number of GPUs) for the highest output throughput.

Every layout gets the same requests (``--input-len`` / ``--output-len``) and
batch per replica (``batch`` 0: the largest that fits each layout, so the
search trades weights' memory for KV cache as a serving engine's operator
does). With a baseline configuration, the best one's tokens/s over the
baseline's on the same hardware is the gain (MAD Max's inference figure, up to
5.27x, Hsia et al., ISCA 2024, arXiv:2310.02784, comes from layouts and
hardware together).
"""

from __future__ import annotations

from dataclasses import replace

from tilecast.cluster.inference import InferenceError, evaluate_inference


def _divisors(n: int) -> list:
    return [d for d in range(1, n + 1) if n % d == 0]


def inference_candidates(shape, cluster, gpus: int, max_pp: int = 16) -> list:
    """(tp, pp, dp, ep) with tp inside a node dividing the heads, pp up to ``max_pp`` stages, tp pp dp = gpus;
    for a mixture of experts every ep dividing both tp and the expert count (the experts spread over ep of
    the tp GPUs, TensorRT-LLM's layout), else ep 1."""
    out = []
    for tp in _divisors(cluster.gpus_per_node):
        if shape.n_head % tp or (shape.n_kv_head % tp and tp % shape.n_kv_head) or gpus % tp:
            continue
        eps = [e for e in _divisors(tp) if shape.n_experts % e == 0] if shape.is_moe else [1]
        for pp in _divisors(min(max_pp, shape.n_layer)):
            if gpus % (tp * pp):
                continue
            out.extend((tp, pp, gpus // (tp * pp), ep) for ep in eps)
    return out


def inference_search(shape, cluster, template, gpus: int, engine, *, top: int = 10, baseline=None) -> dict:
    """The ``top`` fastest layouts that fit (``template``: an InferenceConfig whose tp/pp/dp/ep are replaced);
    with a ``baseline`` InferenceConfig, its result and the best one's output tokens/s over it (``gain``)."""
    results, tried = [], 0
    for tp, pp, dp, ep in inference_candidates(shape, cluster, gpus):
        tried += 1
        try:
            r = evaluate_inference(shape, replace(template, tp=tp, pp=pp, dp=dp, ep=ep), cluster, engine)
        except InferenceError:
            continue
        if r.fits and not r.overloaded:
            results.append(r)
    results.sort(key=lambda r: -r.tokens_per_s)
    out = {"candidates": tried, "fitting": len(results), "top": results[:top]}
    if baseline is not None:
        base = evaluate_inference(shape, baseline, cluster, engine)
        out["baseline"] = base
        out["gain"] = results[0].tokens_per_s / base.tokens_per_s if results else None
    return out


def inference_search_sweep(shape, cluster, template, gpus: int, engine, param: str, values: list, *,
                           baseline=None) -> list:
    """The best serving layout at each point of a hardware sweep; rows as
    :func:`tilecast.cluster.search.search_sweep`'s (``gain``: over the baseline on the same point,
    ``gain_vs_base_hardware``: over the baseline on the unchanged cluster)."""
    from tilecast.cluster.hardware import ClusterError
    from tilecast.cluster.sweep import hardware_point

    base0 = evaluate_inference(shape, baseline, cluster, engine) if baseline is not None else None
    rows = []
    for v in values:
        try:
            c = hardware_point(cluster, param, v)
        except ClusterError as e:
            rows.append({"value": v, "error": str(e)})
            continue
        res = inference_search(shape, c, template, gpus, engine, top=1)
        row = {"value": v, "best": res["top"][0] if res["top"] else None, "fitting": res["fitting"],
               "baseline": None, "gain": None, "gain_vs_base_hardware": None}
        if baseline is not None:
            try:
                row["baseline"] = evaluate_inference(shape, baseline, c, engine)
            except InferenceError as e:
                row["baseline_error"] = str(e)
            if row["best"] is not None:
                if row["baseline"] is not None:
                    row["gain"] = row["best"].tokens_per_s / row["baseline"].tokens_per_s
                row["gain_vs_base_hardware"] = row["best"].tokens_per_s / base0.tokens_per_s
        rows.append(row)
    return rows


def layout_label(r) -> str:
    """``tp2 pp1 dp4 ep2 batch 64`` for a serving result (``ep`` shown when > 1)."""
    c = r.config
    ep = f" ep{c['ep']}" if c.get("ep", 1) != 1 else ""
    return f"tp{c['tp']} pp{c['pp']} dp{c['dp']}{ep} batch {r.batch:.0f}"


def inference_search_sweep_table(param: str, rows: list):
    """The rows of :func:`inference_search_sweep` as a DataFrame."""
    import pandas as pd

    table = []
    for row in rows:
        rec = {param: row["value"]}
        if "error" in row:
            rec["error"] = row["error"]
            table.append(rec)
            continue
        b, base = row["best"], row["baseline"]
        rec["fitting"] = row["fitting"]
        if b is not None:
            c = b.config
            rec.update(best_layout=layout_label(b),
                       tokens_per_s=b.tokens_per_s, ttft_s=b.ttft_s, tpot_s=b.tpot_s,
                       exposed_comm_share=b.breakdown["comm_s"] / b.breakdown["total_s"])
        else:
            rec["note"] = "no layout fits in memory"
        if base is not None:
            rec.update(baseline_tokens_per_s=base.tokens_per_s, baseline_fits=base.fits)
        elif "baseline_error" in row:
            rec["baseline_error"] = row["baseline_error"]
        if row["gain"] is not None or row["gain_vs_base_hardware"] is not None:
            rec.update(gain=row["gain"], gain_vs_base_hardware=row["gain_vs_base_hardware"])
        table.append(rec)
    return pd.DataFrame(table)
