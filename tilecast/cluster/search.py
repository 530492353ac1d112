"""Search parallel layouts for a model on a number of GPUs, under the memory limit.

With a baseline layout the search reports how much the best layout gains over
it (tokens/s of the best / tokens/s of the baseline, both simulated on the same
hardware), the kind of figure MAD Max reports for parallelisation and hardware
co-design (Hsia et al., ISCA 2024, arXiv:2310.02784: up to 2.24x for
pre-training); :func:`search_sweep` finds the best layout at each point of a
hardware sweep.
"""

from __future__ import annotations

import sys

import numpy as np

from tqdm import tqdm

from tilecast.cluster.evaluate import evaluate
from tilecast.cluster.memory import memory_per_gpu
from tilecast.cluster.strategy import Strategy, StrategyError


def _divisors(n: int, limit: int) -> list:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def expert_parallel_sizes(shape, dp: int) -> list:
    """EP degrees worth trying for ``dp`` data-parallel ranks: 1 for a dense model; for a mixture of experts
    every divisor of the routed-expert count that also divides ``dp`` (expert-parallel ranks are
    data-parallel ranks, :meth:`Strategy._check_experts`)."""
    if not shape.is_moe:
        return [1]
    return [e for e in _divisors(shape.n_experts, shape.n_experts) if dp % e == 0]


def candidates(shape, cluster, gpus: int, seq: int, global_batch: int, dtype: str = "bf16",
               attention: str = "flash", micro_batches=(1, 2, 4, 8), max_pp: int = 64, **recipe) -> list:
    """Every layout worth trying: TP inside a node, PP over divisors of the layer count,
    DP the rest, EP (a mixture of experts) over the divisors of the expert count that divide DP;
    micro-batch, ZeRO stage, schedule and recomputation varied. ``recipe``: other Strategy fields every
    candidate takes (e.g. ``capacity_factor``, ``expert_imbalance``, ``grad_reduce_bytes``)."""
    out = []
    for tp in _divisors(cluster.gpus_per_node, cluster.gpus_per_node):
        if shape.n_head % tp or gpus % tp:
            continue
        for pp in _divisors(shape.n_layer, max_pp):
            if gpus % (tp * pp):
                continue
            dp = gpus // (tp * pp)
            for ep in expert_parallel_sizes(shape, dp):
                for mb in micro_batches:
                    if global_batch % (dp * mb):
                        continue
                    m = global_batch // (dp * mb)
                    schedules = [("1f1b", 1)]
                    if pp > 1 and m % pp == 0 and shape.n_layer % (pp * 2) == 0:
                        schedules.append(("interleaved", 2))
                    zeros = (0, 1, 2, 3) if pp == 1 else (0, 1)
                    for zero in zeros:
                        if dp == 1 and zero:
                            continue
                        for sched, v in schedules:
                            for rec in ("none", "selective", "full"):
                                st = Strategy(tp=tp, pp=pp, dp=dp, ep=ep, seq=seq, global_batch=global_batch,
                                              micro_batch=mb, zero=zero, schedule=sched, virtual_stages=v,
                                              recompute=rec, sequence_parallel=tp > 1, dtype=dtype,
                                              attention=attention, **recipe)
                                try:
                                    st.check(shape, cluster)
                                except StrategyError:
                                    continue
                                out.append(st)
    return out


def baseline_layout(template: Strategy, fields: dict, gpus: int) -> Strategy:
    """``template`` with ``fields`` (Strategy fields) replaced; ``dp`` = gpus / (tp cp pp) unless given.
    Raises StrategyError naming the field."""
    st = template.with_(**fields)
    ranks, what = st.tp * st.pp * st.cp, ("tp x pp" if st.cp == 1 else "tp x cp x pp")
    if "dp" not in fields:
        if gpus % ranks:
            raise StrategyError(f"gpus: {gpus} is not a multiple of {what} = {ranks}")
        st = st.with_(dp=gpus // ranks)
    elif st.gpus != gpus:
        raise StrategyError(f"dp: {what} x dp = {st.gpus} differs from the {gpus} GPUs searched")
    if "virtual_stages" not in fields and st.schedule != "interleaved":
        st = st.with_(virtual_stages=1)
    if "sequence_parallel" not in fields and st.tp == 1:
        st = st.with_(sequence_parallel=False)
    return st


def gain(best, baseline) -> float:
    """Throughput of ``best`` over ``baseline`` (two Results)."""
    return best.tokens_per_s / baseline.tokens_per_s


def search(shape, cluster, gpus: int, seq: int, global_batch: int, *, top: int = 10, max_configs: int = 1000,
           progress: bool = True, baseline: Strategy = None, **kw) -> dict:
    """Simulate the layouts that fit in memory and return the ``top`` fastest; with a ``baseline`` layout,
    also its Result (``baseline``) and the best one's throughput over it (``gain``, None when nothing fits).

    When more than ``max_configs`` fit, an evenly spaced subset of them (in
    enumeration order: TP, PP, EP, micro-batch, ZeRO, schedule, recomputation) is
    simulated, so every region of the space keeps representatives.
    """
    cands = candidates(shape, cluster, gpus, seq, global_batch, **kw)
    fitting = [st for st in cands if memory_per_gpu(shape, st, cluster).total <= cluster.gpu.memory_bytes]
    if len(fitting) > max_configs:
        idx = np.unique(np.linspace(0, len(fitting) - 1, max_configs).round().astype(int))
        evaluated = [fitting[i] for i in idx]
    else:
        evaluated = fitting
    results = []
    for st in tqdm(evaluated, desc="layouts", file=sys.stderr, disable=not progress, leave=False):
        results.append(evaluate(shape, st, cluster))
    results.sort(key=lambda r: -r.tokens_per_s)
    out = {"candidates": len(cands), "fitting": len(fitting), "evaluated": len(evaluated), "top": results[:top]}
    if baseline is not None:
        base = evaluate(shape, baseline, cluster)
        out["baseline"] = base
        out["gain"] = gain(results[0], base) if results else None
    return out


def search_sweep(shape, cluster, gpus: int, seq: int, global_batch: int, param: str, values: list, *,
                 baseline: Strategy = None, max_configs: int = 1000, **kw) -> list:
    """The best layout at each point of a hardware sweep (:data:`tilecast.cluster.sweep.HARDWARE_PARAMS`).

    Rows ``{value, best, fitting, baseline, gain, gain_vs_base_hardware}`` (or ``{value, error}``): ``gain``
    is the best layout over the baseline on the same hardware point, ``gain_vs_base_hardware`` the best layout
    at this point over the baseline on the unchanged cluster (hardware and layout together)."""
    from tilecast.cluster.hardware import ClusterError
    from tilecast.cluster.sweep import hardware_point

    base0 = evaluate(shape, baseline, cluster) if baseline is not None else None
    rows = []
    for v in values:
        try:
            c = hardware_point(cluster, param, v)
        except ClusterError as e:
            rows.append({"value": v, "error": str(e)})
            continue
        res = search(shape, c, gpus, seq, global_batch, top=1, max_configs=max_configs, progress=False, **kw)
        row = {"value": v, "best": res["top"][0] if res["top"] else None, "fitting": res["fitting"],
               "baseline": None, "gain": None, "gain_vs_base_hardware": None}
        if baseline is not None:
            try:
                row["baseline"] = evaluate(shape, baseline, c)
            except StrategyError as e:  # e.g. a TP group the resized domain cannot hold
                row["baseline_error"] = str(e)
            if row["best"] is not None:
                if row["baseline"] is not None:
                    row["gain"] = gain(row["best"], row["baseline"])
                row["gain_vs_base_hardware"] = gain(row["best"], base0)
        rows.append(row)
    return rows


def layout_label(strategy: dict) -> str:
    """``tp8 pp4 dp8 sp mb1 zero1 interleaved/2 selective`` for a Result's strategy (sp: sequence parallelism;
    ``ep8``, ``cp2`` added when expert or context parallelism is used)."""
    s = strategy
    sched = s["schedule"] + (f"/{s['virtual_stages']}" if s["schedule"] == "interleaved" else "")
    extra = "".join(f" {k}{s[k]}" for k in ("ep", "cp") if s.get(k, 1) != 1)
    return (f"tp{s['tp']} pp{s['pp']} dp{s['dp']}{extra}{' sp' if s['sequence_parallel'] else ''} "
            f"mb{s['micro_batch']} zero{s['zero']} {sched} {s['recompute']}")


def search_sweep_table(param: str, rows: list):
    """The rows of :func:`search_sweep` as a DataFrame (tokens/s; shares and gains as fractions and ratios)."""
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
            rec.update(best_layout=layout_label(b.strategy), tokens_per_s=b.tokens_per_s, mfu=b.mfu,
                       exposed_comm_share=b.breakdown["exposed_comm_s"] / b.step_s)
        else:
            rec["note"] = "no layout fits in memory"
        if base is not None:
            rec.update(baseline_tokens_per_s=base.tokens_per_s,
                       baseline_exposed_comm_share=base.breakdown["exposed_comm_s"] / base.step_s,
                       baseline_fits=base.fits)
        elif "baseline_error" in row:
            rec["baseline_error"] = row["baseline_error"]
        if row["gain"] is not None or row["gain_vs_base_hardware"] is not None:
            rec.update(gain=row["gain"], gain_vs_base_hardware=row["gain_vs_base_hardware"])
        table.append(rec)
    return pd.DataFrame(table)
