"""Durations of one forward pass of a pipeline stage when serving: prefill and decode.

Each matrix product takes the longer of its compute time (flops / (peak x the
cluster's GEMM efficiency curve), as in training, :mod:`tilecast.cluster.costs`)
and the time to read its weights from HBM (bytes / (bandwidth x efficiency)):
a roofline per kernel. Prefill GEMMs (thousands of tokens) are compute-bound;
decode GEMMs (one token per sequence) read the whole weight matrix for a few
rows of work, so decode is memory-bandwidth-bound until the batch reaches the
GPU's flops-to-bandwidth ratio. Attention: prefill runs the fused kernel at the
cluster's attention efficiency (the training convention for its flops); decode
reads every sequence's KV cache once per layer. Each kernel's time counts as
``compute`` or ``memory`` in the breakdown, whichever bound it.

Tensor parallelism all-reduces the layer output twice per layer (Shoeybi et
al. 2019, Fig. 3). Decode messages are small (batch x d_model x 2 bytes), so
latency dominates: inference engines use a one-shot all-reduce inside a node
(every rank reads the other ranks' buffers over NVLink in one step: TensorRT-
LLM's and vLLM's custom all-reduce), costed here as ``latency + (p-1) n / B``
on the node's fabric, and the faster of it and the NCCL algorithms of
:mod:`tilecast.cluster.collectives` is taken.

What the serving software achieves is an *engine profile*
(``inference_engines.yaml``, :class:`InferenceEfficiency`): the numbers
below, each either fitted on calibration rows of ``validation/inference.yaml``
(``python3 -m tilecast.cluster.inference_calibrate``, which says which for
each engine) or stated in the file, and two switches stated per engine:

- ``decode_hbm_efficiency``: the fraction of HBM bandwidth that weight and
  KV-cache reads reach (GEMV-like kernels stream better than the elementwise
  kernels the cluster's ``memory_efficiency`` is for);
- ``fp8_matmul_scale``: the engine's fp8 GEMM speed relative to the cluster's
  fp8 efficiency curve, capped at the peak (that curve is fitted on training
  runs, whose fp8 GEMMs carry Transformer Engine's casts and scaling);
- ``layer_overhead_s``: seconds per layer and forward pass that no roofline
  counts (kernel launches, synchronisation);
- ``pass_overhead_s``: seconds per forward pass of the whole model (sampling,
  host work, the engine's scheduling);
- ``collective_overhead_s``: seconds each tensor-parallel all-reduce costs
  beyond its alpha-beta time (launch, synchronisation of the ranks);
- ``kv_group_reread``: the fraction of the extra KV traffic of a decode
  attention kernel that does not share a KV head among the g query heads of its
  group (GQA): traffic x (1 + kv_group_reread x (g - 1)); 0 for a kernel that
  reads each KV head once, 1 when every query head re-reads it from HBM;
- ``one_shot_all_reduce``: whether the engine has the one-shot all-reduce;
- ``attention``: the prefill attention kernel: ``flash`` or ``cudnn``, whose speed the cluster file
  gives (fitted on training rows), or ``peak``: a serving engine's own fused kernel (TensorRT-LLM's
  FMHA) taken to run at the bound of that fit, the bf16 peak (:func:`attention_fraction`). The
  engines' figures were fitted with the prefill attention there (the training fit of cuDNN's kernel
  then sat at that bound); it stays there when the training fit moves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import yaml

from tilecast.cluster import flops as F
from tilecast.cluster import params as P
from tilecast.cluster.collectives import Group, collective_time, p2p_time
from tilecast.cluster.inference_memory import INFERENCE_DTYPE_BYTES, kv_heads_per_rank


@dataclass(frozen=True)
class InferenceEfficiency:
    """What a serving engine achieves beyond the hardware's datasheet (module docstring)."""

    name: str = "custom"
    decode_hbm_efficiency: float = 0.80  # fraction of HBM bandwidth reached by weight and KV-cache reads
    fp8_matmul_scale: float = 1.0  # fp8 GEMM speed vs the cluster's (training-fitted) fp8 curve
    layer_overhead_s: float = 10e-6  # per layer and forward pass: launches, synchronisation
    pass_overhead_s: float = 0.0  # per forward pass of the model: sampling, host work, scheduling
    collective_overhead_s: float = 0.0  # per tensor-parallel all-reduce, beyond its alpha-beta time
    kv_group_reread: float = 0.0  # GQA decode attention: fraction of KV re-reads per extra query head
    one_shot_all_reduce: bool = True  # one-shot all-reduce inside a node (else NCCL's algorithms only)
    attention: str = "flash"  # prefill attention kernel (efficiency from the cluster file)
    sources: str = ""  # the rows its figures were fitted on


ENGINES_FILE = os.path.join(os.path.dirname(__file__), "inference_engines.yaml")
DEFAULT_ENGINE = "trtllm-0.9"  # the newest TensorRT-LLM table, with its GQA kernel; FP8 and FP16; A100 to H200
ATTENTION_KERNELS = ("flash", "cudnn", "peak")
_FIELDS = tuple(f for f in InferenceEfficiency.__dataclass_fields__ if f != "name")


def _engine_from_dict(name: str, d) -> InferenceEfficiency:
    if not isinstance(d, dict):
        raise ValueError(f"engine {name}: expected a mapping of {', '.join(_FIELDS)}")
    unknown = sorted(set(d) - set(_FIELDS))
    if unknown:
        raise ValueError(f"engine {name}: unknown field {unknown[0]}")
    out = {}
    for k, v in d.items():
        default = getattr(InferenceEfficiency, k)
        if isinstance(default, bool):
            if not isinstance(v, bool):
                raise ValueError(f"engine {name}: {k} must be true or false, got {v!r}")
        elif isinstance(default, float):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"engine {name}: {k} must be a number >= 0, got {v!r}")
            v = float(v)
        else:
            v = str(v)
        out[k] = v
    if out.get("fp8_matmul_scale", 1.0) <= 0:
        raise ValueError(f"engine {name}: fp8_matmul_scale must be positive")
    if not 0 < out.get("decode_hbm_efficiency", 0.8) <= 1:
        raise ValueError(f"engine {name}: decode_hbm_efficiency must be in (0, 1]")
    if not 0 <= out.get("kv_group_reread", 0.0) <= 1:
        raise ValueError(f"engine {name}: kv_group_reread must be in [0, 1]")
    if out.get("attention", "flash") not in ATTENTION_KERNELS:
        raise ValueError(f"engine {name}: attention must be one of {', '.join(ATTENTION_KERNELS)}")
    return InferenceEfficiency(name=name, **out)


def load_engines(path: str = ENGINES_FILE) -> dict:
    """Engine profiles by name, each checked (ValueError naming the engine and the field)."""
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    engines = data.get("engines") if isinstance(data, dict) else None
    if not isinstance(engines, dict) or not engines:
        raise ValueError(f"engine: {path} has no engines mapping")
    return {str(name): _engine_from_dict(str(name), d) for name, d in engines.items()}


def engine_efficiency(engine=DEFAULT_ENGINE) -> InferenceEfficiency:
    """A shipped engine profile by name (``trtllm-0.6``, ``trtllm-0.5``, ``nemo``, ``argonne-trtllm``,
    ``argonne-vllm``), or a profile itself."""
    if isinstance(engine, InferenceEfficiency):
        return engine
    engines = load_engines()
    if engine not in engines:
        raise ValueError(f"engine: unknown serving engine {engine!r} (expected {', '.join(engines)})")
    return engines[engine]


@dataclass
class PassCost:
    """Seconds of one forward pass of one stage (one TP rank), split by what bounds them.

    Fields may be numpy arrays (one entry per decode step)."""

    compute_s: object = 0.0  # kernels bound by tensor-core throughput
    memory_s: object = 0.0  # kernels bound by HBM bandwidth (weights, KV cache, elementwise)
    comm_s: object = 0.0  # tensor-parallel all-reduces (blocking)
    overhead_s: object = 0.0  # per-layer fixed cost (fitted)
    flops: object = 0.0
    hbm_bytes: object = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def total(self):
        return self.compute_s + self.memory_s + self.comm_s + self.overhead_s

    def add_kernel(self, compute, memory, flops, nbytes):
        compute, memory = np.asarray(compute, dtype=float), np.asarray(memory, dtype=float)
        self.compute_s = self.compute_s + np.where(compute >= memory, compute, 0.0)
        self.memory_s = self.memory_s + np.where(compute >= memory, 0.0, memory)
        self.flops = self.flops + flops
        self.hbm_bytes = self.hbm_bytes + nbytes

    def scaled(self, k) -> PassCost:
        return PassCost(self.compute_s * k, self.memory_s * k, self.comm_s * k, self.overhead_s * k,
                        self.flops * k, self.hbm_bytes * k)

    def plus(self, o: PassCost) -> PassCost:
        return PassCost(self.compute_s + o.compute_s, self.memory_s + o.memory_s, self.comm_s + o.comm_s,
                        self.overhead_s + o.overhead_s, self.flops + o.flops, self.hbm_bytes + o.hbm_bytes)


def one_shot_all_reduce(nbytes: float, p: int, cluster) -> float:
    """One-shot all-reduce inside a node: one latency, each rank reads (p-1) buffers of n bytes."""
    f = cluster.intra_node
    return f.latency + (p - 1) * nbytes / f.effective_bandwidth


def tp_all_reduce(nbytes: float, tp: int, cluster, one_shot: bool = True) -> float:
    """Two of these per layer; the faster of NCCL's algorithms and, inside a node, the one-shot one."""
    if tp <= 1 or nbytes <= 0:
        return 0.0
    group = Group.placed(cluster, tp, stride=1)
    t = collective_time("all_reduce", nbytes, group, cluster)
    if group.nodes == 1 and one_shot:
        t = min(t, one_shot_all_reduce(nbytes, tp, cluster))
    return t


def compute_dtype(weight_dtype: str) -> str:
    return weight_dtype  # fp8 weights run fp8 GEMMs; bf16/fp16 weights run in their own precision


def attention_fraction(gpu, kernel: str, dtype: str) -> float:
    """Speed of the prefill attention kernel relative to the GPU's ``dtype`` GEMM curve: the cluster
    file's figure, or for ``peak`` the one that puts the kernel at the peak (1 / the curve's plateau) on a
    GPU whose file has a vendor kernel (``cudnn``: Hopper); elsewhere (A100) FlashAttention's figure."""
    if kernel == "peak" and "cudnn" in gpu.attention_efficiency:
        return 1.0 / max(gpu.matmul_efficiency[dtype].fraction)
    return gpu.attention_fraction(kernel)


def gemm_time(gpu, flops, dtype: str, eff) -> np.ndarray:
    """The cluster's GEMM time (fp8: divided by the engine's ``fp8_matmul_scale``, never faster than the peak)."""
    f = np.asarray(flops, dtype=float)
    if dtype != "fp8":
        return gpu.matmul_time(f, dtype)
    return np.maximum(gpu.matmul_time(f, dtype) / eff.fp8_matmul_scale, f / gpu.peak_flops[dtype])


def layer_pass(shape, cluster, *, tp: int, seqs: int, new_tokens: int, context, weight_dtype: str, kv_dtype: str,
               eff: InferenceEfficiency = None, ep: int = 1, cp: int = 1, expert_load: float = 1.0,
               capacity_factor: float = 0.0) -> PassCost:
    """One layer's forward on one TP rank: ``seqs`` sequences, each adding ``new_tokens`` tokens
    (the prompt in prefill, 1 in decode) after ``context`` tokens already cached (scalar or array).

    ``cp`` > 1 (context parallelism): the prompt's tokens and the KV cache are split over ``cp`` GPUs;
    prefill passes key/value blocks around the ring (:func:`prefill_ring_exposed`), decode reads the
    rank's 1/cp of the cache and merges the partial attention outputs with one all-reduce. A mixture
    of experts: :func:`moe_kernels`."""
    eff = eff or InferenceEfficiency()
    gpu = cluster.gpu
    bw = gpu.memory_bandwidth * eff.decode_hbm_efficiency
    wb, kb = INFERENCE_DTYPE_BYTES[weight_dtype], INFERENCE_DTYPE_BYTES[kv_dtype]
    dt = compute_dtype(weight_dtype)
    attn_dt = "bf16" if dt == "fp8" else dt
    h, f, k, q = shape.n_embd, shape.intermediate_size, shape.kv_dim, shape.q_dim
    prefill = new_tokens > 1
    tokens = seqs * new_tokens // cp if prefill else seqs * new_tokens
    cost = PassCost()
    weights = {"qkv": h * (q + 2 * k), "proj": q * h, "fc1": h * f * (2 if shape.gated_mlp else 1), "fc2": f * h}
    inputs = {"qkv": h, "proj": q, "fc1": h, "fc2": f}  # a product's input width: weights / it = its output width
    for name, fl in F.layer_gemm_flops(shape, tokens, new_tokens, tp).items():
        if shape.is_moe and name in ("fc1", "fc2"):
            continue
        nbytes = weights[name] / tp * wb + tokens * (weights[name] / inputs[name] / tp) * 2
        cost.add_kernel(gemm_time(gpu, fl, dt, eff), nbytes / bw, fl, nbytes)
    if shape.is_moe:
        for fl, nbytes, calls in moe_kernels(shape, tokens, tp, ep, wb, expert_load):
            cost.add_kernel(calls * gemm_time(gpu, fl / calls, dt, eff), nbytes / bw, fl, nbytes)
    context = np.asarray(context, dtype=float)
    kvh = kv_heads_per_rank(shape, tp)
    ring = 0.0
    if prefill:  # prefill: fused attention over the prompt (training's flops convention), cache written
        fl = F.layer_attention_flops(shape, tokens, new_tokens, tp)
        t = gpu.matmul_time(fl, attn_dt) / attention_fraction(gpu, eff.attention, attn_dt) \
            * F.fused_attention_head_padding(shape.head_dim)
        nbytes = tokens * 2 * kvh * shape.head_dim * kb
        cost.add_kernel(t, nbytes / bw, fl, nbytes)
        ring = prefill_ring_exposed(cluster, cp, tp, nbytes, float(t))
    else:  # decode: each sequence reads its cached keys and values once (its 1/cp share of them)
        unique = seqs * (context + 1) * 2 * kvh * shape.head_dim * kb / cp
        reread = unique * eff.kv_group_reread * (shape.n_head // shape.n_kv_head - 1)  # on die (L2), see GPU
        fl = 4.0 * seqs * (context + 1) * q / tp / cp
        read_t = unique / bw + reread / (gpu.cache_reread_bandwidth * eff.decode_hbm_efficiency)
        cost.add_kernel(gpu.matmul_time(np.maximum(fl, 1.0), attn_dt), read_t, fl, unique + reread)
        if cp > 1:  # partial attention outputs (and their softmax statistics) merged over the cp ranks
            ring = collective_time("all_reduce", seqs * h / tp * 2.0, Group.placed(cluster, cp, stride=tp), cluster)
    # layer norms, residual adds, activation function: HBM-bound at the elementwise efficiency
    if shape.is_moe:
        m, fe = P.moe_layer_share(shape), shape.expert_intermediate_size
        width = (1 - m) * f + m * (shape.n_experts_per_token * expert_load + shape.n_shared_experts) * fe
        elem = 12.0 * tokens * h * 2 + (3 if shape.gated_mlp else 2) * tokens * width / tp * 2
    else:
        elem = 12.0 * tokens * h * 2 + (3 if shape.gated_mlp else 2) * tokens * f / tp * 2
    cost.add_kernel(0.0, gpu.memory_time(elem), 0.0, elem)
    ones = np.ones_like(context)
    ar = tp_all_reduce(tokens * h * 2.0, tp, cluster, eff.one_shot_all_reduce)
    a2a = expert_dispatch(shape, cluster, tokens, tp, ep, capacity_factor)
    cost.comm_s = (2 * (ar + (eff.collective_overhead_s if tp > 1 else 0.0)) + a2a + ring) * ones
    cost.overhead_s = eff.layer_overhead_s * ones
    cost.compute_s, cost.memory_s = cost.compute_s * ones, cost.memory_s * ones
    return cost


def experts_touched(n_experts: int, top_k: int, tokens) -> np.ndarray:
    """Expected distinct experts at least one of ``tokens`` tokens is routed to, each picking ``top_k`` of
    ``n_experts`` uniformly: n (1 - (1 - k/n)^tokens); the experts whose weights a pass reads."""
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** np.asarray(tokens, dtype=float))


def moe_kernels(shape, tokens: int, tp: int, ep: int, wb: int, load: float) -> list:
    """(flops, HBM bytes, calls) of a mixture of experts' MLP kernels on one GPU, the mean over the layers
    (``calls``: GEMM calls per layer, also the mean, so that flops / calls is one call's).

    The experts are spread over ``ep`` of the ``tp`` GPUs and each split over the other ``tp / ep``
    (TensorRT-LLM's expert and tensor parallelism of MoE layers), so a GPU holds 1/tp of every layer's
    expert weights whatever ``ep``. Flops: ``tokens x top-k x load`` rows through the experts' matrices,
    1/tp of them per GPU (``load``: the busiest GPU's over the mean). Weights read: those of the experts
    the pass's tokens touch (:func:`experts_touched`: all of them in a prefill, top-k per token in a
    decode step of one sequence; with a skew ``load`` > 1, at most n_experts / load of them, the tokens
    read as spread over that many), plus the shared experts and, in the leading dense layers, the MLP.

    The routed experts run as one GEMM per expert and matrix (a grouped GEMM: each expert's rows,
    tokens x top-k / the experts touched, against its own weights): ``calls`` = the experts a GPU runs,
    so a call's size, which sets its efficiency on the cluster's GEMM curve, is one expert's, not the
    layer's (a decode step of 32 sequences gives Mixtral's experts 8 rows each); its input projection
    (gate and up, fused) and its output projection are separate calls, as for the dense MLP.
    """
    h, fe, m = shape.n_embd, shape.expert_intermediate_size, P.moe_layer_share(shape)
    mats = 3 if shape.gated_mlp else 2
    expert_w = mats * h * fe
    routed = tokens * shape.n_experts_per_token * load
    # routing skewed by ``load`` (the busiest expert's share over the mean) is read as tokens spread evenly over
    # n_experts / load experts: a pass reads at most those
    touched = min(float(experts_touched(shape.n_experts, shape.n_experts_per_token, tokens)),
                  max(float(shape.n_experts_per_token), shape.n_experts / load))
    calls = max(1.0, touched / ep)  # experts with tokens on one GPU (ep of the tp GPUs split the experts)
    out = []
    # input projection (h x (mats - 1) fe, gate and up fused) writing (mats - 1) fe per row; output projection
    # (fe x h) writing h per row
    for w, out_width in ((h * (mats - 1) * fe, (mats - 1) * fe), (fe * h, h)):
        out.append((2.0 * routed * w / tp * m, (touched * w / tp * wb + routed * out_width / tp * 2) * m, calls * m))
    if shape.n_shared_experts:
        w = shape.n_shared_experts * expert_w
        acts = tokens * shape.n_shared_experts * ((mats - 1) * fe + h) / tp * 2
        out.append((2.0 * tokens * w / tp * m, (w / tp * wb + acts) * m, m))
    out.append((2.0 * tokens * h * shape.n_experts * m, (h * shape.n_experts * wb + tokens * h * 2) * m, m))  # router
    if m < 1:
        w = mats * h * shape.intermediate_size
        out.append((2.0 * tokens * w / tp * (1 - m), (w / tp * wb + tokens * ((mats - 1) * shape.intermediate_size + h)
                                                       / tp * 2) * (1 - m), 1 - m))
    return out


def expert_dispatch(shape, cluster, tokens: int, tp: int, ep: int, capacity_factor: float = 0.0) -> float:
    """Seconds of one layer's expert dispatch and combine (two all-to-alls over the ``ep`` ranks, the mean
    over the layers); 0 without experts or with ``ep`` 1 (experts split like the dense MLP)."""
    if not shape.is_moe or ep == 1:
        return 0.0
    n = F.all_to_all_bytes(shape, tokens, tp, 2, capacity_factor)
    one = collective_time("all_to_all", n, Group.placed(cluster, ep, stride=1), cluster)
    return 2.0 * one * P.moe_layer_share(shape)


def prefill_ring_exposed(cluster, cp: int, tp: int, kv_bytes: float, attn_s: float) -> float:
    """Ring attention in a prefill split over ``cp`` GPUs: ``cp - 1`` steps each passing the rank's key/value
    block (``kv_bytes``), overlapped with 1/cp of the rank's attention; the part not hidden."""
    if cp == 1:
        return 0.0
    group = Group.placed(cluster, cp, stride=tp)
    step = p2p_time(kv_bytes, cluster, group.nodes > 1)
    return (cp - 1) * max(0.0, step - attn_s / cp)


def head_pass(shape, cluster, *, tp: int, seqs: int, weight_dtype: str,
              eff: InferenceEfficiency = None) -> PassCost:
    """LM head on the last token of each sequence (16-bit weights), vocabulary split over TP."""
    eff = eff or InferenceEfficiency()
    gpu = cluster.gpu
    dt = "bf16" if weight_dtype == "fp8" else weight_dtype
    fl = F.lm_head_flops(shape, seqs, tp)
    nbytes = shape.vocab_size * shape.n_embd / tp * 2 + seqs * shape.vocab_size / tp * 4
    cost = PassCost()
    cost.add_kernel(gemm_time(gpu, fl, dt, eff), nbytes / (gpu.memory_bandwidth * eff.decode_hbm_efficiency), fl, nbytes)
    return cost


def stage_pass(shape, cluster, *, tp: int, layers: int, last: bool, n_stages: int = 1, seqs: int, new_tokens: int, context,
               weight_dtype: str, kv_dtype: str,
               eff: InferenceEfficiency = None, **parallel) -> PassCost:
    """A pipeline stage of ``layers`` layers (plus the LM head when ``last``); the engine's per-pass
    overhead is spread over the ``n_stages`` stages."""
    eff = eff or InferenceEfficiency()
    c = layer_pass(shape, cluster, tp=tp, seqs=seqs, new_tokens=new_tokens, context=context,
                   weight_dtype=weight_dtype, kv_dtype=kv_dtype, eff=eff, **parallel).scaled(layers)
    if last:
        c = c.plus(head_pass(shape, cluster, tp=tp, seqs=seqs, weight_dtype=weight_dtype, eff=eff))
    c.overhead_s = c.overhead_s + eff.pass_overhead_s / max(1, n_stages)
    return c


def stage_send(shape, cluster, *, tp: int, tokens: int, crosses_node: bool) -> float:
    """Activations handed to the next pipeline stage (each TP rank sends its 1/tp share)."""
    return p2p_time(tokens * shape.n_embd * 2.0 / tp, cluster, crosses_node)
