"""Cluster descriptions: nodes x GPUs, peak FLOP/s, efficiency curves, memory, fabrics.

A cluster is read from a YAML file (shipped ones live in ``clusters/``) and
validated when loaded; every error names the offending field. Figures and their
sources sit side by side in the YAML files.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace

import numpy as np
import yaml

CLUSTER_DIR = os.path.join(os.path.dirname(__file__), "clusters")
DTYPES = ("bf16", "fp16", "fp8", "tf32", "fp32")
# A fused attention kernel's speed is relative to the GEMM curve, which is an end-to-end figure (a
# framework's overheads included); Hopper's cuDNN / FlashAttention-3 kernels beat it, so up to 2x is
# admitted, as long as attention x the curve's plateau stays within the peak (checked on load).
ATTENTION_MAX = 2.0
ATTENTION_KERNELS = ("flash", "cudnn")  # FlashAttention-style kernels; cuDNN fused attention (Transformer Engine)


class ClusterError(ValueError):
    """A cluster description that cannot be used; the message names the field."""


@dataclass(frozen=True)
class EfficiencyCurve:
    """Achievable fraction of peak as a function of the work of one kernel call.

    Points are (flops of one call, fraction of peak); between points the fraction
    is interpolated linearly in log10(flops), outside them it is held constant.
    """

    flops: tuple
    fraction: tuple

    def __call__(self, flops):
        x = np.log10(np.maximum(np.asarray(flops, dtype=float), 1.0))
        return np.interp(x, np.log10(self.flops), self.fraction)


@dataclass(frozen=True)
class GPU:
    name: str
    peak_flops: dict  # dtype -> FLOP/s (dense)
    matmul_efficiency: dict  # dtype -> EfficiencyCurve
    memory_bytes: float
    memory_bandwidth: float  # bytes/s
    memory_efficiency: float  # achievable fraction of memory_bandwidth for elementwise kernels
    attention_efficiency: dict = field(default_factory=dict)  # kernel -> fused attention speed vs. the matmul curve
    reserved_bytes: float = 0.0  # context, workspaces, fragmentation: not available to the model
    gemm_half_dim: float = 0.0  # smallest GEMM dimension at which the shape factor is 1/2 (0: no shape factor)
    reread_bandwidth: float = 0.0  # bytes/s of data re-read from on-die caches (0: memory_bandwidth), see below

    @property
    def cache_reread_bandwidth(self) -> float:
        """Rate of traffic that re-reads data a kernel has just brought on die (a decode attention kernel's
        query heads re-reading their group's KV head): an on-die (L2) rate, the die's, not the HBM's.

        It is not separable from how much is re-read (the serving engines' ``kv_group_reread``, fitted on
        H100 rows), so it is stated relative to the die whose rows fitted it: unset, the GPU's own HBM
        bandwidth; the H200 (the H100 die with HBM3e) states the H100's, so that its faster HBM does not
        speed up traffic that never leaves the die; the A100 states the H100's scaled by the two dies' L2
        bandwidths (``dgx-a100.yaml``), not its own HBM figure, which would make the same re-read traffic
        1.6 times slower on the A100 than on the H100 where its L2 is only 1.24 times slower.
        """
        return self.reread_bandwidth or self.memory_bandwidth

    def shape_factor(self, min_dim):
        """Fraction of the flops curve a GEMM reaches given its smallest dimension d: d / (d + d_half).

        Thin GEMMs waste more of each tile and wave and stream more bytes per flop
        (NVIDIA, "Matrix Multiplication Background User's Guide": tile and wave
        quantisation; Anthony et al. 2024, "The Case for Co-Designing Model
        Architectures with Hardware", arXiv:2401.14489: GEMM throughput grows with
        the hidden size). The saturating form is an assumption; d_half is fitted
        (``calibrate.py``).
        """
        d = np.asarray(min_dim, dtype=float)
        if self.gemm_half_dim <= 0:
            return np.ones_like(d)
        return d / (d + self.gemm_half_dim)

    def matmul_time(self, flops, dtype: str, min_dim=None):
        """Seconds for GEMM calls of ``flops`` each (array-friendly). ``min_dim``: the smallest of
        the GEMM's three dimensions (m, n, k); None leaves the shape factor out (the flops curve alone)."""
        peak = self.peak_flops[dtype]
        f = np.asarray(flops, dtype=float)
        eff = self.matmul_efficiency[dtype](f)
        if min_dim is not None:
            eff = eff * self.shape_factor(min_dim)
        return f / (peak * eff)

    def attention_fraction(self, kernel: str) -> float:
        """Speed of a fused attention kernel relative to a GEMM of the same flops (1.0 when unknown)."""
        eff = self.attention_efficiency
        return eff.get(kernel, eff.get("flash", 1.0))

    def memory_time(self, nbytes):
        return np.asarray(nbytes, dtype=float) / (self.memory_bandwidth * self.memory_efficiency)


@dataclass(frozen=True)
class Fabric:
    """A link class. ``bandwidth``: bytes/s per GPU per direction; ``efficiency``: the
    achievable fraction of it for collectives (NCCL bus bandwidth / link bandwidth)."""

    name: str
    bandwidth: float
    latency: float
    efficiency: float

    @property
    def effective_bandwidth(self) -> float:
        return self.bandwidth * self.efficiency


@dataclass(frozen=True)
class Cluster:
    name: str
    gpus_per_node: int
    nodes: int
    gpu: GPU
    intra_node: Fabric  # NVLink / NVSwitch
    inter_node: Fabric  # per-GPU share of the node's NICs
    nics_per_node: int = 1
    nic_bandwidth: float = 0.0
    sources: dict = field(default_factory=dict, compare=False)

    @property
    def n_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def scaled(self, *, flops=1.0, hbm_bandwidth=1.0, network_bandwidth=1.0,
               nvlink_bandwidth=1.0, memory=1.0, network_latency=1.0) -> "Cluster":
        """A what-if copy with some hardware figures multiplied."""
        g = self.gpu
        gpu = replace(g, peak_flops={k: v * flops for k, v in g.peak_flops.items()},
                      memory_bandwidth=g.memory_bandwidth * hbm_bandwidth,
                      reread_bandwidth=g.cache_reread_bandwidth,  # on die: HBM what-ifs leave it
                      memory_bytes=g.memory_bytes * memory)
        return replace(
            self, gpu=gpu,
            intra_node=replace(self.intra_node, bandwidth=self.intra_node.bandwidth * nvlink_bandwidth),
            inter_node=replace(self.inter_node, bandwidth=self.inter_node.bandwidth * network_bandwidth,
                               latency=self.inter_node.latency * network_latency),
            nic_bandwidth=self.nic_bandwidth * network_bandwidth,
        )

    def with_scale_up_domain(self, gpus: int) -> "Cluster":
        """A what-if copy whose NVLink (scale-up) domain holds ``gpus`` GPUs, as an NVL72 rack does.

        The GPUs in total stay (rounded up to whole domains); each GPU keeps its NVLink bandwidth and
        its share of scale-out bandwidth (NICs grow with the domain), so only what crosses a domain
        boundary changes: tensor-parallel groups that no longer span domains, data-parallel groups with
        more ranks per domain.
        """
        if isinstance(gpus, bool) or int(gpus) != gpus or gpus < 1:
            raise ClusterError(f"cluster {self.name}: gpus_per_node (NVLink domain) must be a whole number >= 1, "
                               f"got {gpus!r}")
        gpus = int(gpus)
        nics = self.nics_per_node * gpus / self.gpus_per_node
        return replace(self, gpus_per_node=gpus, nodes=-(-self.n_gpus // gpus),
                       nics_per_node=int(nics) if nics == int(nics) else nics)

    def with_nics(self, nics_per_node: int) -> "Cluster":
        """A what-if copy with ``nics_per_node`` NICs of the same speed per node (scale-out bandwidth per GPU)."""
        if isinstance(nics_per_node, bool) or int(nics_per_node) != nics_per_node or nics_per_node < 1:
            raise ClusterError(f"cluster {self.name}: inter_node.nics_per_node must be a whole number >= 1, "
                               f"got {nics_per_node!r}")
        n = int(nics_per_node)
        return replace(self, nics_per_node=n,
                       inter_node=replace(self.inter_node, bandwidth=n * self.nic_bandwidth / self.gpus_per_node))

    def with_memory_bytes(self, nbytes: float) -> "Cluster":
        """A what-if copy whose GPUs have ``nbytes`` of HBM."""
        if isinstance(nbytes, bool) or not nbytes > 0:
            raise ClusterError(f"cluster {self.name}: gpu.memory_bytes must be positive, got {nbytes!r}")
        return replace(self, gpu=replace(self.gpu, memory_bytes=float(nbytes)))


# ---------------------------------------------------------------- loading


def available() -> list:
    return sorted(f[:-5] for f in os.listdir(CLUSTER_DIR) if f.endswith(".yaml"))


def load_cluster(spec: str) -> Cluster:
    """A shipped cluster name (``dgx-a100``, ``dgx-h100``, ``dgx-h200``, ...) or a YAML file."""
    spec = str(spec)
    path = spec if os.path.exists(spec) else os.path.join(CLUSTER_DIR, spec + ".yaml")
    if not os.path.exists(path):
        raise ClusterError(f"cluster: {spec!r} is neither a shipped cluster ({', '.join(available())}) nor a file")
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise ClusterError(f"cluster {spec}: not valid YAML ({str(e).splitlines()[0]})") from None
    return from_dict(data, where=os.path.splitext(os.path.basename(path))[0])


def _num(data, key, where, *, positive=True, at_most=None, integer=False):
    if not isinstance(data, dict) or key not in data:
        raise ClusterError(f"cluster {where}: missing field {key}")
    v = data[key]
    try:
        if isinstance(v, bool):
            raise ValueError
        x = float(v)
    except (TypeError, ValueError):
        raise ClusterError(f"cluster {where}: {key} must be a number, got {v!r}") from None
    if not math.isfinite(x) or (positive and x <= 0) or (not positive and x < 0):
        raise ClusterError(f"cluster {where}: {key} must be {'positive' if positive else 'non-negative'}, got {v!r}")
    if at_most is not None and x > at_most:
        raise ClusterError(f"cluster {where}: {key} must be at most {at_most}, got {v!r}")
    if integer:
        if x != int(x):
            raise ClusterError(f"cluster {where}: {key} must be a whole number, got {v!r}")
        return int(x)
    return x


def _section(data, key, where):
    v = data.get(key) if isinstance(data, dict) else None
    if not isinstance(v, dict):
        raise ClusterError(f"cluster {where}: missing section {key}")
    return v


def _curve(points, where) -> EfficiencyCurve:
    if not isinstance(points, list) or not points:
        raise ClusterError(f"cluster {where}: expected a list of [flops, fraction] points")
    xs, ys = [], []
    for i, p in enumerate(points):
        if not (isinstance(p, (list, tuple)) and len(p) == 2):
            raise ClusterError(f"cluster {where}[{i}]: expected [flops, fraction]")
        x = _num({"flops": p[0]}, "flops", f"{where}[{i}]")
        y = _num({"fraction": p[1]}, "fraction", f"{where}[{i}]", at_most=1.0)
        if xs and x <= xs[-1]:
            raise ClusterError(f"cluster {where}[{i}]: flops must increase from point to point")
        xs.append(x)
        ys.append(y)
    return EfficiencyCurve(tuple(xs), tuple(ys))


def _attention(v, where) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        x = _num({"attention_efficiency": v}, "attention_efficiency", f"{where}: gpu", at_most=ATTENTION_MAX)
        return {k: x for k in ATTENTION_KERNELS}
    out = {}
    for k in v:
        if k not in ATTENTION_KERNELS:
            raise ClusterError(f"cluster {where}: gpu.attention_efficiency.{k} is not a known kernel "
                               f"({', '.join(ATTENTION_KERNELS)})")
        out[k] = _num(v, k, f"{where}: gpu.attention_efficiency", at_most=ATTENTION_MAX)
    return out


def _fabric(data, key, where, bandwidth) -> Fabric:
    w = f"{where}: {key}"
    return Fabric(
        name=str(data.get("name", key)),
        bandwidth=bandwidth,
        latency=_num(data, "latency_s", w),
        efficiency=_num(data, "efficiency", w, at_most=1.0),
    )


def from_dict(data, where: str = "custom") -> Cluster:
    if not isinstance(data, dict):
        raise ClusterError(f"cluster {where}: expected a mapping with gpus_per_node, nodes, gpu, intra_node, inter_node")
    known = {"name", "gpus_per_node", "nodes", "gpu", "intra_node", "inter_node", "sources", "description"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ClusterError(f"cluster {where}: unknown field {unknown[0]}")
    name = str(data.get("name", where))
    g = _section(data, "gpu", name)
    peak_raw = _section(g, "peak_flops", f"{name}: gpu")
    peak = {}
    for dt, v in peak_raw.items():
        if dt not in DTYPES:
            raise ClusterError(f"cluster {name}: gpu.peak_flops.{dt} is not a known dtype ({', '.join(DTYPES)})")
        peak[dt] = _num(peak_raw, dt, f"{name}: gpu.peak_flops")
    eff_raw = _section(g, "matmul_efficiency", f"{name}: gpu")
    eff = {}
    for dt, pts in eff_raw.items():
        if dt not in peak:
            raise ClusterError(f"cluster {name}: gpu.matmul_efficiency.{dt} has no gpu.peak_flops.{dt}")
        eff[dt] = _curve(pts, f"{name}: gpu.matmul_efficiency.{dt}")
    missing = [dt for dt in peak if dt not in eff]
    if missing:
        raise ClusterError(f"cluster {name}: gpu.matmul_efficiency.{missing[0]} is missing")
    gpu = GPU(
        name=str(g.get("name", "gpu")),
        peak_flops=peak,
        matmul_efficiency=eff,
        memory_bytes=_num(g, "memory_bytes", f"{name}: gpu"),
        memory_bandwidth=_num(g, "memory_bandwidth", f"{name}: gpu"),
        memory_efficiency=_num(g, "memory_efficiency", f"{name}: gpu", at_most=1.0),
        attention_efficiency=_attention(g.get("attention_efficiency"), name),
        reserved_bytes=_num(g, "reserved_bytes", f"{name}: gpu", positive=False) if "reserved_bytes" in g else 0.0,
        gemm_half_dim=_num(g, "gemm_half_dim", f"{name}: gpu", positive=False) if "gemm_half_dim" in g else 0.0,
        reread_bandwidth=_num(g, "reread_bandwidth", f"{name}: gpu") if "reread_bandwidth" in g else 0.0,
    )
    attn_dt = "bf16" if "bf16" in eff else next(iter(eff))
    for k, a in gpu.attention_efficiency.items():
        if a * max(eff[attn_dt].fraction) > 1.0:
            raise ClusterError(f"cluster {name}: gpu.attention_efficiency.{k} = {a} times the {attn_dt} curve's "
                               f"plateau {max(eff[attn_dt].fraction)} exceeds the peak")
    gpn = _num(data, "gpus_per_node", name, integer=True)
    nodes = _num(data, "nodes", name, integer=True)
    intra = _section(data, "intra_node", name)
    inter = _section(data, "inter_node", name)
    nics = _num(inter, "nics_per_node", f"{name}: inter_node", integer=True)
    nic_bw = _num(inter, "nic_bandwidth", f"{name}: inter_node")
    return Cluster(
        name=name,
        gpus_per_node=gpn,
        nodes=nodes,
        gpu=gpu,
        intra_node=_fabric(intra, "intra_node", name, _num(intra, "bandwidth", f"{name}: intra_node")),
        # Each GPU's share of the node's NICs: all GPUs of a node talk at once in symmetric layouts.
        inter_node=_fabric(inter, "inter_node", name, nics * nic_bw / gpn),
        nics_per_node=nics,
        nic_bandwidth=nic_bw,
        sources=dict(data.get("sources") or {}),
    )
