"""Serving a model on a cluster: prefill and decode of a batch, or continuous batching at a request rate.

Two modes:

- **fixed batch** (``request_rate == 0``): ``batch`` requests of ``input_len``
  prompt tokens arrive together, are prefilled in one pass (which yields the
  first output token), then decoded together for ``output_len - 1`` steps, the
  context growing by one token a step (static batching, as TensorRT-LLM's
  ``gptSessionBenchmark`` measures). TTFT = the prefill; TPOT = the mean
  decode step; output tokens/s = batch x output_len / (prefill + decode).
- **continuous batching** (``request_rate > 0`` requests/s): each engine
  iteration decodes the N running sequences one token and prefills the prompts
  that arrived meanwhile (in-flight batching with the prompt's prefill in the
  iteration, as vLLM and TensorRT-LLM schedule). In steady state the iteration
  time T(N) = D(N) + lambda T(N) P, where D is the decode step of N sequences
  at the mean context (input + output/2) and P the prefill cost of one prompt,
  and by Little's law N = lambda x output_len x T(N); the fixed point is found
  by iteration. TTFT ~ 1.5 T (half an iteration's wait, then the iteration
  that prefills it); TPOT = T. When N would exceed the largest batch that fits
  (or ``max_batch``), the server is overloaded: the queue grows without bound,
  ``overloaded`` is true, and the figures are those of the saturated server.

Pipeline parallelism: the batch is split into ``min(pp, batch)`` micro-batches
that follow each other through the stages, so all stages work at once; a
decode iteration (every sequence one token further) takes
``max(m x stage, pp x (stage + send))`` for ``m`` micro-batches. Data
parallelism (``dp``) multiplies independent replicas: throughput and the
request rate scale with it, per-request latencies do not.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from tilecast.cluster.inference_costs import DEFAULT_ENGINE, engine_efficiency, stage_pass, stage_send
from tilecast.cluster.inference_memory import (INFERENCE_DTYPE_BYTES, inference_memory, kv_bytes_per_token,
                                               largest_batch, stage_layers)

PREFILL_GROUP = 8  # prompts over which a prefill pass is amortised in continuous batching


class InferenceError(ValueError):
    """A serving configuration that cannot run; the message starts with the field at fault."""


@dataclass(frozen=True)
class InferenceConfig:
    """How a model is served. ``batch`` 0 = the largest batch that fits in memory."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    batch: int = 1
    input_len: int = 128
    output_len: int = 128
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    request_rate: float = 0.0  # requests/s over all replicas; 0 = fixed batch
    max_batch: int = 0  # continuous batching: most sequences in flight (0: what memory allows)
    ep: int = 1  # a mixture of experts' experts spread over ep of the tp GPUs (each split over tp / ep)
    cp: int = 1  # context parallelism: prompts' prefill and the KV cache split over cp GPUs
    capacity_factor: float = 0.0  # 0: dropless; c > 0: expert buffers padded to c x the mean load
    expert_imbalance: float = 1.0  # dropless: the busiest expert's tokens over the mean (>= 1)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def parallel(self) -> dict:
        """The experts' and context-parallel settings the layer passes take."""
        return dict(ep=self.ep, cp=self.cp, capacity_factor=self.capacity_factor,
                    expert_load=self.capacity_factor if self.capacity_factor > 0 else self.expert_imbalance)

    def to_dict(self) -> dict:
        return asdict(self)

    def check(self, shape, cluster=None) -> InferenceConfig:
        for f in ("tp", "pp", "dp", "input_len", "output_len", "ep", "cp"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InferenceError(f"{f}: must be a whole number >= 1, got {v!r}")
        for f in ("batch", "max_batch"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise InferenceError(f"{f}: must be a whole number >= 0, got {v!r}")
        r = self.request_rate
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or r < 0:
            raise InferenceError(f"request_rate: must be a number >= 0 (requests/s), got {r!r}")
        for f in ("weight_dtype", "kv_dtype"):
            if getattr(self, f) not in INFERENCE_DTYPE_BYTES:
                raise InferenceError(f"{f}: must be one of {', '.join(INFERENCE_DTYPE_BYTES)}, got {getattr(self, f)!r}")
        if shape.n_head % self.tp:
            raise InferenceError(f"tp: {self.tp} does not divide the {shape.n_head} attention heads")
        if shape.n_kv_head % self.tp and self.tp % shape.n_kv_head:
            raise InferenceError(f"tp: {self.tp} and the {shape.n_kv_head} key/value heads do not divide each other")
        for f in ("capacity_factor", "expert_imbalance"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= (1 if f == "expert_imbalance" else 0):
                raise InferenceError(f"{f}: must be a number >= {1 if f == 'expert_imbalance' else 0}, got {v!r}")
        if self.ep > 1:
            if not shape.is_moe:
                raise InferenceError(f"ep: {shape.name} has no experts (expert parallelism needs a mixture of experts)")
            if shape.n_experts % self.ep:
                raise InferenceError(f"ep: {self.ep} does not divide the {shape.n_experts} experts of {shape.name}")
            if self.tp % self.ep:
                raise InferenceError(f"ep: {self.ep} does not divide tp {self.tp} (experts are spread over the "
                                     f"tensor-parallel GPUs)")
        if self.cp > 1 and self.input_len % self.cp:
            raise InferenceError(f"cp: {self.cp} does not divide the {self.input_len} prompt tokens (input_len)")
        if self.pp > shape.n_layer:
            raise InferenceError(f"pp: {self.pp} stages for {shape.n_layer} layers")
        if cluster is not None:
            if self.gpus > cluster.n_gpus:
                what = "tp x pp x dp" if self.cp == 1 else "tp x cp x pp x dp"
                raise InferenceError(f"tp: {what} = {self.gpus} exceeds the {cluster.n_gpus} GPUs of {cluster.name}")
            if self.weight_dtype not in cluster.gpu.peak_flops:
                raise InferenceError(f"weight_dtype: {cluster.gpu.name} has no {self.weight_dtype} peak in {cluster.name}")
            g = cluster.gpus_per_node
            if self.tp > g:
                raise InferenceError(f"tp: {self.tp} exceeds the {g} GPUs of a node (tensor parallelism stays in a node)")
            if g % self.tp:
                raise InferenceError(f"tp: {self.tp} does not divide the {g} GPUs of a node")
        return self


@dataclass
class InferenceResult:
    model: str
    cluster: str
    config: dict
    mode: str  # "fixed-batch" or "continuous"
    gpus: int
    batch: float  # sequences in flight per replica (continuous: the steady-state mean)
    max_batch: int  # largest batch that fits in memory per replica
    tokens_per_s: float  # output tokens/s, all replicas
    tokens_per_s_per_gpu: float
    total_tokens_per_s: float  # (input + output) tokens/s, all replicas
    ttft_s: float
    tpot_s: float
    request_latency_s: float
    requests_per_s: float
    overloaded: bool
    prefill: dict
    decode: dict
    breakdown: dict
    memory: dict
    memory_per_gpu_bytes: float
    memory_capacity_bytes: float
    fits: bool
    kv_bytes_per_token: float

    def to_dict(self) -> dict:
        def clean(v):
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            if isinstance(v, (float, np.floating)):
                return float(v) if math.isfinite(v) else None
            if isinstance(v, np.integer):
                return int(v)
            return v

        return clean(asdict(self))


def _pass_dict(c) -> dict:
    return {"compute_s": float(np.sum(c.compute_s)), "memory_s": float(np.sum(c.memory_s)),
            "comm_s": float(np.sum(c.comm_s)), "overhead_s": float(np.sum(c.overhead_s)),
            "flops": float(np.sum(c.flops)), "hbm_bytes": float(np.sum(c.hbm_bytes))}


class _Pipeline:
    """Per-iteration times of one replica: stage passes, pipelined over micro-batches."""

    def __init__(self, shape, cfg, cluster, eff):
        self.shape, self.cfg, self.cluster, self.eff = shape, cfg, cluster, eff
        self.layers = stage_layers(shape, cfg.pp)
        self.crosses = cfg.tp * cfg.cp * cfg.pp > cluster.gpus_per_node

    def _stage(self, seqs, new_tokens, context):
        cfg = self.cfg
        return stage_pass(self.shape, self.cluster, tp=cfg.tp, layers=self.layers, last=True, seqs=seqs,
                          new_tokens=new_tokens, context=context, weight_dtype=cfg.weight_dtype,
                          kv_dtype=cfg.kv_dtype, eff=self.eff, n_stages=cfg.pp, **cfg.parallel)

    def iteration(self, seqs, new_tokens, context, cyclic=True):
        """(seconds for every sequence to advance one pass, what one GPU of the last stage spends meanwhile).

        ``cyclic``: decode, where micro-batch j's next pass waits for its previous one to leave the last
        stage; otherwise (prefill) the micro-batches flow through once: (m + pp - 1) stage passes."""
        pp = self.cfg.pp
        m = max(1, min(pp, int(seqs)))
        per = max(1, math.ceil(seqs / m))
        stage = self._stage(per, new_tokens, context)
        if pp == 1:
            return stage.total, stage
        send = stage_send(self.shape, self.cluster, tp=self.cfg.tp,
                          tokens=per * new_tokens // (self.cfg.cp if new_tokens > 1 else 1), crosses_node=self.crosses)
        if cyclic:
            t = np.maximum(m * stage.total, pp * (stage.total + send))
        else:
            t = (m + pp - 1) * stage.total + (pp - 1) * send
        # what one GPU spends per iteration: its m micro-batch passes (the head's share folded into the stage)
        cost = stage.scaled(m)
        cost.extra["send_s"] = send
        cost.extra["idle_s"] = t - m * stage.total
        return t, cost


def _breakdown(costs, total_s, idle_s=0.0) -> dict:
    out = {"compute_s": 0.0, "memory_s": 0.0, "comm_s": 0.0, "overhead_s": 0.0}
    for c in costs:
        for k in out:
            out[k] += float(np.sum(getattr(c, k)))
    out["pipeline_idle_s"] = float(idle_s)
    out["total_s"] = float(total_s)
    return out


def evaluate_inference(shape, cfg: InferenceConfig, cluster, engine=DEFAULT_ENGINE):
    """Predict serving ``shape`` as ``cfg`` on ``cluster`` with a serving ``engine`` (a shipped profile's
    name or an :class:`~tilecast.cluster.inference_costs.InferenceEfficiency`); see the module docstring."""
    cfg.check(shape, cluster)
    eff = engine_efficiency(engine)
    pipe = _Pipeline(shape, cfg, cluster, eff)
    s_in, s_out = cfg.input_len, cfg.output_len
    fits_max = largest_batch(shape, cluster, tp=cfg.tp, pp=cfg.pp, input_len=s_in, output_len=s_out,
                             weight_dtype=cfg.weight_dtype, kv_dtype=cfg.kv_dtype,
                             prefill_tokens_per_sequence=s_in if cfg.request_rate == 0 else 0, cp=cfg.cp)
    if cfg.request_rate == 0:
        return _fixed_batch(shape, cfg, cluster, pipe, fits_max)
    return _continuous(shape, cfg, cluster, pipe, fits_max)


def _result(shape, cfg, cluster, *, mode, batch, fits_max, out_tps, ttft, tpot, latency, rps, overloaded,
            prefill, decode, breakdown, prefill_tokens):
    mem = inference_memory(shape, cluster, tp=cfg.tp, pp=cfg.pp, batch=math.ceil(batch),
                           context=cfg.input_len + cfg.output_len, prefill_tokens=prefill_tokens,
                           weight_dtype=cfg.weight_dtype, kv_dtype=cfg.kv_dtype, cp=cfg.cp)
    total_tps = out_tps * (cfg.input_len + cfg.output_len) / cfg.output_len
    return InferenceResult(
        model=shape.name, cluster=cluster.name, config=cfg.to_dict(), mode=mode, gpus=cfg.gpus, batch=float(batch),
        max_batch=int(fits_max), tokens_per_s=float(out_tps), tokens_per_s_per_gpu=float(out_tps / cfg.gpus),
        total_tokens_per_s=float(total_tps), ttft_s=float(ttft), tpot_s=float(tpot),
        request_latency_s=float(latency), requests_per_s=float(rps), overloaded=bool(overloaded),
        prefill=prefill, decode=decode, breakdown=breakdown, memory=mem.to_dict(),
        memory_per_gpu_bytes=mem.total, memory_capacity_bytes=cluster.gpu.memory_bytes,
        fits=mem.total <= cluster.gpu.memory_bytes,
        kv_bytes_per_token=kv_bytes_per_token(shape, cfg.tp, cfg.pp, cfg.kv_dtype, cfg.cp))


def _fixed_batch(shape, cfg, cluster, pipe, fits_max):
    b = cfg.batch or fits_max
    if b < 1:
        raise InferenceError(f"batch: not even one sequence fits beside the weights on {cluster.gpu.name} "
                             f"(tp {cfg.tp}, pp {cfg.pp}, {cfg.weight_dtype} weights)")
    s_in, s_out = cfg.input_len, cfg.output_len
    t_pre, c_pre = pipe.iteration(b, s_in, 0, cyclic=False)
    contexts = s_in + np.arange(1, s_out)  # tokens already cached at each decode step
    if len(contexts):
        t_dec, c_dec = pipe.iteration(b, 1, contexts)
        t_dec = np.broadcast_to(np.asarray(t_dec, dtype=float), contexts.shape)
        decode_s = float(np.sum(t_dec))
    else:
        t_dec, c_dec, decode_s = np.zeros(0), None, 0.0
    t_pre = float(t_pre)
    total = t_pre + decode_s
    tpot = decode_s / len(contexts) if len(contexts) else 0.0
    out_tps = b * s_out / total * cfg.dp
    idle = float(np.sum(c_pre.extra.get("idle_s", 0.0)))
    pre = {**_pass_dict(c_pre), "time_s": t_pre, "tokens": b * s_in}
    dec = {"time_s": decode_s, "steps": len(contexts), "tokens": b * len(contexts)}
    costs = [c_pre]
    if c_dec is not None:
        dec.update(_pass_dict(c_dec))
        idle += float(np.sum(c_dec.extra.get("idle_s", 0.0)))
        costs.append(c_dec)
    bd = _breakdown(costs, total, idle)
    return _result(shape, cfg, cluster, mode="fixed-batch", batch=b, fits_max=fits_max, out_tps=out_tps, ttft=t_pre,
                   tpot=tpot, latency=total, rps=b / total * cfg.dp, overloaded=False, prefill=pre, decode=dec,
                   breakdown=bd, prefill_tokens=b * s_in)


def _continuous(shape, cfg, cluster, pipe, fits_max):
    s_in, s_out = cfg.input_len, cfg.output_len
    lam = cfg.request_rate / cfg.dp  # per replica
    cap = min(fits_max, cfg.max_batch) if cfg.max_batch else fits_max
    if cap < 1:
        raise InferenceError(f"max_batch: not even one sequence fits beside the weights on {cluster.gpu.name}")
    ctx = s_in + s_out / 2.0
    # prefill cost of one prompt inside an iteration: a pass over PREFILL_GROUP prompts, per prompt (the
    # weights a lone prompt would read are read for the decode batch anyway)
    p_one = float(pipe.iteration(PREFILL_GROUP, s_in, 0, cyclic=False)[0]) / PREFILL_GROUP

    def step(n):
        d = float(pipe.iteration(max(1, math.ceil(n)), 1, ctx)[0])
        return d, d / max(1e-12, 1.0 - lam * p_one) if lam * p_one < 1 else math.inf

    n = 1.0
    for _ in range(200):  # monotone fixed-point iteration of N = lambda s_out T(N)
        t = step(n)[1]
        n_new = lam * s_out * t
        if not math.isfinite(n_new) or n_new > cap:
            n = math.inf
            break
        if abs(n_new - n) <= 1e-6 * max(1.0, n):
            n = n_new
            break
        n = max(n_new, 1e-9)
    overloaded = not math.isfinite(n)
    if overloaded:  # saturated: cap sequences in flight, prefill as fast as they finish
        n = cap
        d = float(pipe.iteration(cap, 1, ctx)[0])
        # each finishing sequence is replaced by a prefill: per iteration cap / s_out prompts
        t = d + cap / s_out * p_one
        rate = cap / s_out / t
    else:
        d, t = step(n)
        rate = lam
    dec_cost = pipe.iteration(max(1, math.ceil(n)), 1, ctx)[1]
    pre_cost = pipe.iteration(PREFILL_GROUP, s_in, 0, cyclic=False)[1].scaled(1.0 / PREFILL_GROUP)
    share = rate * t  # prompts prefilled per iteration
    bd = _breakdown([dec_cost, pre_cost.scaled(share)], t, float(np.sum(dec_cost.extra.get("idle_s", 0.0))))
    out_tps = rate * s_out * cfg.dp
    ttft = 1.5 * t if not overloaded else math.inf
    return _result(shape, cfg, cluster, mode="continuous", batch=n, fits_max=cap, out_tps=out_tps, ttft=ttft, tpot=t,
                   latency=ttft + (s_out - 1) * t, rps=rate * cfg.dp, overloaded=overloaded,
                   prefill={**_pass_dict(pre_cost), "time_s": p_one, "tokens": s_in},
                   decode={**_pass_dict(dec_cost), "time_s": d, "steps": 1, "tokens": math.ceil(n)},
                   breakdown=bd, prefill_tokens=s_in)
