"""``tc.whatif``, ``tc.whatif_search``, ``tc.whatif_inference`` and ``tc.load_cluster``: distributed training and serving at cluster
scale (``tilecast whatif``). Bad input raises a ValueError whose message starts with the argument at fault
(:class:`tilecast.errors.FieldError`, or the cluster package's ``StrategyError``, ``ClusterError``,
``InferenceError``, and ``ModelConfigError``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tilecast.api.base import _config, _positive, _Result
from tilecast.errors import FieldError


def load_cluster(cluster):
    """A cluster description (:class:`tilecast.cluster.hardware.Cluster`) from a shipped name (``dgx-h100``), a
    YAML file, or a Cluster (returned as it is): what ``cluster`` is in the ``tc.whatif*`` calls. Its
    ``scaled(network_bandwidth=2, ...)`` is a what-if copy with hardware figures multiplied."""
    return cluster_of(cluster)


def cluster_of(cluster):
    """A Cluster from a shipped name, a YAML file, or a Cluster."""
    from tilecast.cluster.hardware import Cluster, load_cluster

    if isinstance(cluster, Cluster):
        return cluster
    try:
        return load_cluster(cluster)
    except OSError as e:  # a directory, an unreadable file
        raise FieldError(f"cluster: cannot read {cluster} ({e.strerror or e})") from None


def _result_rows(results) -> list:
    """One row per cluster.evaluate.Result: the layout's fields, its figures and its breakdown."""
    return [{"model": r.model, "cluster": r.cluster, "gpus": r.gpus, **r.strategy, "step_s": r.step_s,
             "tokens_per_s": r.tokens_per_s, "tflops_per_gpu": r.tflops_per_gpu, "mfu": r.mfu, "hfu": r.hfu,
             "fits": r.fits, **r.breakdown, "memory_per_gpu_bytes": r.memory_per_gpu_bytes} for r in results]


# --- whatif ------------------------------------------------------------------------------------------------
@dataclass
class WhatifResult(_Result):
    """Distributed training at cluster scale (``tilecast whatif``): one layout's step time, breakdown,
    throughput, MFU and memory per GPU; with ``search``, the fastest layouts (``top``), best first."""

    model: str
    cluster: str
    gpus: int
    step_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    fits: bool
    strategy: dict
    breakdown: dict
    memory: dict
    searched: dict | None = None  # with search: candidates, fitting, evaluated
    top: list = field(repr=False, default_factory=list)  # cluster.evaluate.Result, best first
    timeline: object = field(repr=False, default=None)
    hfu: float = 0.0  # hardware flops utilisation: MFU plus the recomputed forward work
    layout: object = field(repr=False, default=None)  # the cluster.strategy.Strategy evaluated (not with search)

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(_result_rows(self.top))

    def _headline(self) -> str:
        return (f"{self.model} on {self.gpus} x {self.cluster}: step {self.step_s:.4g} s, "
                f"{self.tokens_per_s:,.0f} tokens/s, MFU {100 * self.mfu:.1f}%")


def whatif(model="gpt3-175b", cluster="dgx-a100", gpus: int = 0, seq: int = 2048, global_batch: int = 0,
           micro_batch: int = 1, tp: int = 1, pp: int = 1, dp: int = 0, search: bool = False, top: int = 10,
           max_configs: int = 1000, **recipe) -> WhatifResult:
    """Predict a distributed training step (``tilecast whatif``). Counts left at 0 take the command's defaults
    (:func:`tilecast.cluster.strategy.layout`); ``recipe``: other Strategy fields (``zero``, ``schedule``,
    ``recompute``, ``dtype``, ``cp``, ``ep``, ``stage_layers``, ...). ``search``: the ``top`` fastest layouts
    that fit on ``gpus`` GPUs (:func:`whatif_search`; an error when none fits). ``cluster``: a shipped name, a
    YAML file or a :class:`tilecast.cluster.hardware.Cluster` (e.g. a what-if copy,
    ``load_cluster("dgx-h100").scaled(network_bandwidth=2)``). ``top[0]`` is the layout's
    :class:`tilecast.cluster.evaluate.Result`."""
    from tilecast.cluster.evaluate import evaluate
    from tilecast.cluster.strategy import layout

    if search:
        found = whatif_search(model, cluster, gpus, seq, global_batch, top=top, max_configs=max_configs, **recipe)
        if not found.top:
            raise FieldError(f"gpus: no layout of {found.model} on {gpus} GPUs of {found.cluster} fits in memory")
        best, results = found.top[0], found.top
        searched = {"candidates": found.candidates, "fitting": found.fitting, "evaluated": found.evaluated}
    else:
        c, shape = cluster_of(cluster), _config(model)
        st = layout(gpus=gpus, tp=tp, pp=pp, dp=dp, global_batch=global_batch, micro_batch=micro_batch, seq=seq,
                    **recipe)
        best, searched = evaluate(shape, st, c), None
        results = [best]
    layout_ = None if search else st
    return WhatifResult(best.model, best.cluster, best.gpus, best.step_s, best.tokens_per_s, best.tflops_per_gpu,
                        best.mfu, best.fits, best.strategy, best.breakdown, best.memory, searched, results,
                        best.timeline, best.hfu, layout_)


@dataclass
class WhatifSearchResult(_Result):
    """The fastest layouts of a model on ``gpus`` GPUs (``tilecast whatif --search``): ``to_frame()`` has one row
    per layout, best first (empty when none fits in memory); with a ``baseline`` layout, its Result and
    ``gain``, the best layout's tokens/s over the baseline's (None when none fits)."""

    model: str
    cluster: str
    gpus: int
    seq: int
    global_batch: int
    candidates: int
    fitting: int
    evaluated: int
    gain: float | None = None
    top: list = field(repr=False, default_factory=list)  # cluster.evaluate.Result, best first
    baseline: object = field(repr=False, default=None)  # cluster.evaluate.Result of the baseline layout
    sweeps: dict = field(repr=False, default_factory=dict)  # param -> DataFrame: the best layout at each point

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(_result_rows(self.top))

    def _headline(self) -> str:
        return (f"{self.model} on {self.gpus} x {self.cluster}: {self.candidates} layouts, {self.fitting} fit, "
                f"{self.evaluated} simulated")


def whatif_search(model="gpt3-175b", cluster="dgx-a100", gpus: int = 8, seq: int = 2048, global_batch: int = 0,
                  top: int = 10, max_configs: int = 1000, baseline=None, progress: bool = False, sweeps=None,
                  **recipe) -> WhatifSearchResult:
    """Search the layouts (TP, PP, DP, micro-batch, ZeRO, schedule, recomputation; EP for a mixture of experts)
    of ``model`` on ``gpus`` GPUs of ``cluster`` that fit in memory and simulate the ``top`` fastest
    (``tilecast whatif --search``); ``global_batch`` 0: ``gpus`` sequences. ``recipe``: what every layout
    shares (``dtype``, ``attention``, ``capacity_factor``, ``expert_imbalance``, ``grad_reduce_bytes``);
    ``baseline``: a :class:`tilecast.cluster.strategy.Strategy` to compare the best with. ``sweeps``: hardware
    parameters to vary ({param: values}, :func:`tilecast.api.sweeps.sweep_values`): the search again at each
    point (``sweeps``: a DataFrame per parameter, :func:`tilecast.cluster.search.search_sweep_table`)."""
    from tilecast.api.sweeps import sweep_values
    from tilecast.cluster.search import search as search_layouts
    from tilecast.cluster.search import search_sweep, search_sweep_table
    from tilecast.cluster.sweep import HARDWARE_PARAMS

    c, shape = cluster_of(cluster), _config(model)
    _positive("gpus", gpus)
    for name, v in (("top", top), ("max_configs", max_configs)):
        _positive(name, v)
    if gpus > c.n_gpus:
        raise FieldError(f"gpus: {gpus} exceeds the {c.n_gpus} GPUs of {c.name}")
    dtype = recipe.get("dtype", "bf16")
    if dtype not in c.gpu.peak_flops:
        raise FieldError(f"dtype: {c.gpu.name} has no {dtype} peak in {c.name}")
    attention = recipe.get("attention", "flash")
    if attention not in ("flash", "cudnn", "unfused"):
        raise FieldError(f"attention: must be flash, cudnn or unfused, got {attention!r}")
    gb = global_batch or gpus
    specs = [] if not sweeps else sweep_values(sweeps, HARDWARE_PARAMS,
                                               context=" with search (hardware parameters only)")
    res = search_layouts(shape, c, gpus, seq, gb, top=top, max_configs=max_configs, progress=progress,
                         baseline=baseline, **recipe)
    tables = {p: search_sweep_table(p, search_sweep(shape, c, gpus, seq, gb, p, values, baseline=baseline,
                                                    max_configs=max_configs, **recipe)) for p, values in specs}
    return WhatifSearchResult(shape.name, c.name, gpus, seq, gb, res["candidates"], res["fitting"], res["evaluated"],
                              res.get("gain"), list(res["top"]), res.get("baseline"), tables)


# --- whatif --inference ------------------------------------------------------------------------------------
@dataclass
class InferenceWhatifResult(_Result):
    """Serving a model on a cluster (``tilecast whatif --inference``): throughput, time to first token, time
    per output token, breakdown and memory per GPU; ``to_frame()`` has one row."""

    model: str
    cluster: str
    engine: str
    mode: str
    gpus: int
    tokens_per_s: float
    ttft_s: float
    tpot_s: float
    batch: float
    max_batch: int
    fits: bool
    overloaded: bool
    breakdown: dict
    memory: dict
    result: object = field(repr=False, default=None)  # cluster.inference.InferenceResult
    config: object = field(repr=False, default=None)  # cluster.inference.InferenceConfig
    efficiency: object = field(repr=False, default=None)  # cluster.inference_costs.InferenceEfficiency
    sweeps: dict = field(repr=False, default_factory=dict)  # param -> DataFrame of the configuration swept

    def to_frame(self):
        import pandas as pd

        d = self.result.to_dict()
        flat = {k: v for k, v in d.items() if not isinstance(v, dict)}
        return pd.DataFrame([{"engine": self.engine, **d["config"], **flat, **self.breakdown}])

    def _headline(self) -> str:
        ttft = "unbounded" if self.overloaded and self.mode == "continuous" else f"{1e3 * self.ttft_s:.1f} ms"
        return (f"{self.model} served on {self.gpus} x {self.cluster}: {self.tokens_per_s:,.0f} output tokens/s, "
                f"TTFT {ttft}, TPOT {1e3 * self.tpot_s:.2f} ms")


def whatif_inference(model="llama3-70b", cluster="dgx-h100", tp: int = 1, pp: int = 1, dp: int = 0, batch: int = 1,
                     input_len: int = 128, output_len: int = 128, dtype: str = "bf16", kv_dtype: str | None = None,
                     request_rate: float = 0.0, max_batch: int = 0, engine=None, gpus: int = 0, ep: int = 1,
                     cp: int = 1, capacity_factor: float = 0.0, expert_imbalance: float = 1.0,
                     sweeps=None) -> InferenceWhatifResult:
    """Predict serving a model (``tilecast whatif --inference``): ``batch`` requests together (0: the largest
    batch that fits), or continuous batching at ``request_rate`` requests/s. ``dtype``: the weights'
    (bf16, fp16, fp8); ``kv_dtype``: the KV cache's (default ``dtype``); ``engine``: a serving-engine profile
    name (default the shipped default) or a :class:`tilecast.cluster.inference_costs.InferenceEfficiency`;
    ``cluster``: a shipped name, a YAML file or a :class:`tilecast.cluster.hardware.Cluster`. ``gpus`` with
    ``dp`` 0 (the default): dp = gpus / (tp cp pp), 1 without ``gpus``; ``ep``, ``cp``: expert and context
    parallelism inside the ``tp`` GPUs and over the prompt; ``capacity_factor``, ``expert_imbalance``: a
    mixture of experts' routing. ``sweeps``: {param: values} (:func:`tilecast.api.sweeps.sweep_values`; hardware
    multipliers or configuration fields): the configuration at each value (``sweeps``: a DataFrame per
    parameter, :func:`tilecast.cluster.inference_sweep.inference_sweep_table`)."""
    from tilecast.api.sweeps import sweep_values
    from tilecast.cluster.inference import InferenceConfig, evaluate_inference
    from tilecast.cluster.inference_sweep import (INFERENCE_PARAMS, inference_sweep, inference_sweep_table,
                                                  parse_inference_values)
    from tilecast.cluster.inference_costs import DEFAULT_ENGINE, InferenceEfficiency, engine_efficiency, load_engines

    c, shape = cluster_of(cluster), _config(model)
    if not isinstance(engine, InferenceEfficiency):
        known = load_engines()
        if (engine or DEFAULT_ENGINE) not in known:
            raise FieldError(f"engine: unknown serving engine {engine!r} (expected {', '.join(known)})")
    eff = engine_efficiency(engine or DEFAULT_ENGINE)
    tp, pp, cp = tp or 1, pp or 1, cp or 1
    what = "tp x pp" if cp == 1 else "tp x cp x pp"
    if not dp:
        if gpus and gpus % (tp * pp * cp):
            raise FieldError(f"gpus: {gpus} is not a multiple of {what} = {tp * pp * cp}")
        dp = gpus // (tp * pp * cp) if gpus else 1
    elif gpus and gpus != tp * pp * dp * cp:
        raise FieldError(f"gpus: {gpus} differs from {what} x dp = {tp * pp * dp * cp}")
    cfg = InferenceConfig(tp=tp, pp=pp, dp=dp, batch=batch, input_len=input_len, output_len=output_len,
                          weight_dtype=dtype, kv_dtype=kv_dtype or dtype, request_rate=request_rate,
                          max_batch=max_batch, ep=ep, cp=cp, capacity_factor=capacity_factor,
                          expert_imbalance=expert_imbalance)
    cfg.check(shape, c)
    specs = [] if not sweeps else sweep_values(sweeps, INFERENCE_PARAMS, parse_inference_values, " with inference")
    r = evaluate_inference(shape, cfg, c, eff)
    tables = {p: inference_sweep_table(p, inference_sweep(shape, cfg, c, p, values, eff)) for p, values in specs}
    return InferenceWhatifResult(r.model, r.cluster, eff.name, r.mode, r.gpus, r.tokens_per_s, r.ttft_s, r.tpot_s,
                                 r.batch, r.max_batch, r.fits, r.overloaded, r.breakdown, r.memory, r, cfg, eff,
                                 tables)
