"""A parallel layout and training recipe for one step, validated against a model and a cluster."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from tilecast.cluster.pipeline_split import SPLITS

SCHEDULES = ("gpipe", "1f1b", "interleaved")
RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("flash", "cudnn", "unfused")  # FlashAttention-style kernel, cuDNN fused attention, scores materialised
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "tf32": 4, "fp32": 4}


class StrategyError(ValueError):
    """A layout that cannot run; the message starts with the field at fault."""


@dataclass(frozen=True)
class Strategy:
    """Everything about how a step is run, apart from the model and the hardware.

    ``global_batch`` and ``micro_batch`` are in sequences; gradient accumulation
    is ``global_batch / (dp * micro_batch)`` micro-batches per step.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    seq: int = 2048
    global_batch: int = 512
    micro_batch: int = 1
    zero: int = 0  # 0 = plain data parallelism (DDP), 1/2/3 = ZeRO stage (3 = FSDP full sharding)
    schedule: str = "1f1b"
    virtual_stages: int = 1  # model chunks per pipeline rank (interleaved 1F1B)
    recompute: str = "none"
    sequence_parallel: bool = False
    dtype: str = "bf16"
    attention: str = "flash"
    overlap_grad_reduce: bool = True  # gradient reduction in buckets during the last backward
    grad_reduce_bytes: int = 2  # bytes per gradient element, kept and reduced (2: bf16/fp16, 4: fp32)
    collective_algo: str = "auto"  # auto | ring | tree | hierarchical (see collectives.py)
    tp_comm_overlap: bool = False  # tensor-parallel collectives overlapped with GEMMs (Transformer Engine userbuffers)
    overlap_param_gather: bool = False  # ZeRO-1/2: gather updated parameters during the next forward
    bucket_bytes: float = 25e6  # gradient bucket size in bytes (PyTorch DDP's default bucket_cap_mb = 25)
    fsdp_prefetch: int = 1  # layers of all-gather issued ahead (ZeRO-3)
    pipeline_split: str = "even"  # even | head (LM-head aware), see pipeline_split.py
    stage_layers: tuple = ()  # explicit layers per pipeline stage (overrides pipeline_split)
    ep: int = 1  # expert parallelism: each MoE layer's routed experts spread over ep of the data-parallel ranks
    capacity_factor: float = 0.0  # 0: dropless; c > 0: each expert's buffer padded to c x the mean load
    expert_imbalance: float = 1.0  # dropless: the busiest expert's tokens over the mean (>= 1)
    cp: int = 1  # context parallelism: each sequence split over cp ranks (ring attention)
    shard_group: int = 0  # ZeRO/FSDP: data-parallel ranks states are sharded over (0: all dp; N < dp: hybrid)

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def shard_ranks(self) -> int:
        """Ranks ZeRO shards the dense model states over: the shard group (or all dp ranks) x cp."""
        return (self.shard_group or self.dp) * self.cp

    @property
    def expert_load(self) -> float:
        """The busiest expert-parallel rank's routed tokens over the mean: the capacity factor when buffers
        are padded to capacity, else the imbalance (dropless)."""
        return self.capacity_factor if self.capacity_factor > 0 else self.expert_imbalance

    @property
    def micro_batches(self) -> int:
        return self.global_batch // (self.dp * self.micro_batch)

    def with_(self, **kw) -> "Strategy":
        return replace(self, **kw)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stage_layers"] = list(self.stage_layers)  # as JSON has it
        return d

    def check(self, shape, cluster=None) -> "Strategy":
        """Raise StrategyError naming the field if this layout cannot run ``shape``."""
        for f in ("tp", "pp", "dp", "seq", "global_batch", "micro_batch", "virtual_stages", "ep", "cp"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise StrategyError(f"{f}: must be a whole number >= 1, got {v!r}")
        if self.zero not in (0, 1, 2, 3):
            raise StrategyError(f"zero: must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.schedule not in SCHEDULES:
            raise StrategyError(f"schedule: must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.recompute not in RECOMPUTE:
            raise StrategyError(f"recompute: must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        if self.attention not in ATTENTION:
            raise StrategyError(f"attention: must be one of {', '.join(ATTENTION)}, got {self.attention!r}")
        if self.collective_algo not in ("auto", "ring", "tree", "hierarchical"):
            raise StrategyError(f"collective_algo: must be auto, ring, tree or hierarchical, got {self.collective_algo!r}")
        if self.grad_reduce_bytes not in (2, 4):
            raise StrategyError(f"grad_reduce_bytes: must be 2 (bf16/fp16) or 4 (fp32), got {self.grad_reduce_bytes!r}")
        if self.dtype not in DTYPE_BYTES:
            raise StrategyError(f"dtype: must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")
        if self.global_batch % (self.dp * self.micro_batch):
            raise StrategyError(
                f"global_batch: {self.global_batch} is not a multiple of dp x micro_batch = "
                f"{self.dp} x {self.micro_batch}")
        self._check_experts(shape)
        self._check_context_and_sharding()
        if shape.learned_positions and self.seq > shape.learned_positions:
            raise StrategyError(f"seq: {self.seq} exceeds the {shape.learned_positions} positions of "
                                f"{shape.name}'s learned position table")
        if shape.n_head % self.tp:
            raise StrategyError(f"tp: {self.tp} does not divide the {shape.n_head} attention heads")
        if shape.n_kv_head % self.tp and self.tp % shape.n_kv_head:
            raise StrategyError(f"tp: {self.tp} and the {shape.n_kv_head} key/value heads do not divide each other")
        if self.schedule == "interleaved":
            if self.pp < 2:
                raise StrategyError("schedule: interleaved needs pp >= 2")
            if self.micro_batches % self.pp:
                raise StrategyError(
                    f"schedule: interleaved, the {self.micro_batches} micro-batches are not a multiple of pp {self.pp}")
        elif self.virtual_stages != 1:
            raise StrategyError("virtual_stages: only with schedule interleaved")
        chunks = self.pp * self.virtual_stages
        if self.pipeline_split not in SPLITS:
            raise StrategyError(f"pipeline_split: must be one of {', '.join(SPLITS)}, got {self.pipeline_split!r}")
        if self.stage_layers:
            sl = tuple(self.stage_layers)
            if len(sl) != self.pp or any(not isinstance(x, int) or isinstance(x, bool) or x < 1 for x in sl):
                raise StrategyError(f"stage_layers: expected pp = {self.pp} whole numbers >= 1, got {list(sl)}")
            if sum(sl) != shape.n_layer:
                raise StrategyError(f"stage_layers: {list(sl)} sum to {sum(sl)}, the model has {shape.n_layer} layers")
        if (self.stage_layers or self.pipeline_split != "even") and self.virtual_stages != 1 and self.pp > 1:
            raise StrategyError("stage_layers/pipeline_split: uneven stages need virtual_stages 1 (no interleaving)")
        if not self.stage_layers and self.pipeline_split == "even" and shape.n_layer % chunks:
            raise StrategyError(
                f"pp/virtual_stages: {shape.n_layer} layers do not split into pp x virtual stages = {chunks} equal "
                f"chunks (pipeline_split head or stage_layers split them unevenly)")
        if self.sequence_parallel and self.tp == 1:
            raise StrategyError("sequence_parallel: needs tp >= 2")
        if self.sequence_parallel and (self.seq // self.cp) % self.tp:
            raise StrategyError(f"sequence_parallel: seq / cp = {self.seq // self.cp} is not a multiple of tp {self.tp}")
        if cluster is not None:
            if self.gpus > cluster.n_gpus:
                raise StrategyError(f"gpus: tp x cp x pp x dp = {self.gpus} exceeds the {cluster.n_gpus} GPUs of "
                                    f"{cluster.name}")
            if self.dtype not in cluster.gpu.peak_flops:
                raise StrategyError(f"dtype: {cluster.gpu.name} has no {self.dtype} peak in {cluster.name}")
            g = cluster.gpus_per_node
            if self.tp > g and self.tp % g:
                raise StrategyError(f"tp: {self.tp} spans nodes unevenly ({g} GPUs per node)")
            if self.tp < g and g % self.tp:
                raise StrategyError(f"tp: {self.tp} does not divide the {g} GPUs of a node")
        return self

    def _check_experts(self, shape):
        for f in ("capacity_factor", "expert_imbalance"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise StrategyError(f"{f}: must be a number >= 0, got {v!r}")
        if self.expert_imbalance < 1:
            raise StrategyError(f"expert_imbalance: the busiest expert's load over the mean is >= 1, got "
                                f"{self.expert_imbalance}")
        if self.ep > 1 and not shape.is_moe:
            raise StrategyError(f"ep: {shape.name} has no experts (expert parallelism needs a mixture of experts)")
        if shape.is_moe and shape.n_experts % self.ep:
            raise StrategyError(f"ep: {self.ep} does not divide the {shape.n_experts} experts of {shape.name}")
        if self.dp % self.ep:
            raise StrategyError(f"ep: {self.ep} does not divide dp {self.dp} (expert-parallel ranks are "
                                f"data-parallel ranks)")

    def _check_context_and_sharding(self):
        if self.cp > 1 and self.seq % (2 * self.cp):
            raise StrategyError(f"cp: seq {self.seq} does not split into 2 x cp = {2 * self.cp} equal chunks "
                                f"(the load-balanced causal split of ring attention)")
        g = self.shard_group
        if not isinstance(g, int) or isinstance(g, bool) or g < 0:
            raise StrategyError(f"shard_group: must be a whole number >= 0, got {g!r}")
        if g:
            if self.zero == 0:
                raise StrategyError("shard_group: needs zero 1, 2 or 3 (states sharded within the group)")
            if self.dp % g:
                raise StrategyError(f"shard_group: {g} does not divide dp {self.dp}")


def layout(gpus: int = 0, tp: int = 1, pp: int = 1, dp: int = 0, global_batch: int = 0, micro_batch: int = 1,
           schedule: str = "1f1b", virtual_stages: int = 0, cp: int = 1, **recipe) -> Strategy:
    """The Strategy a user means by counts left at 0: ``dp`` = ``gpus / (tp cp pp)`` (1 without ``gpus``),
    ``global_batch`` = dp x micro_batch x 2pp, ``virtual_stages`` 2 when interleaved (else 1). ``recipe``:
    the other Strategy fields. Not checked against a model (:meth:`Strategy.check`)."""
    tp, pp, cp = tp or 1, pp or 1, cp or 1
    if not isinstance(micro_batch, int) or isinstance(micro_batch, bool) or micro_batch < 1:
        raise StrategyError(f"micro_batch: must be a whole number >= 1, got {micro_batch!r}")
    if not isinstance(cp, int) or isinstance(cp, bool) or cp < 1:
        raise StrategyError(f"cp: must be a whole number >= 1, got {cp!r}")
    if not dp:
        if gpus and gpus % (tp * pp * cp):
            what = "tp x pp" if cp == 1 else "tp x cp x pp"
            raise StrategyError(f"gpus: {gpus} is not a multiple of {what} = {tp * pp * cp}")
        dp = gpus // (tp * pp * cp) if gpus else 1
    elif gpus and gpus != tp * pp * dp * cp:
        what = "tp x pp x dp" if cp == 1 else "tp x cp x pp x dp"
        raise StrategyError(f"gpus: {gpus} differs from {what} = {tp * pp * dp * cp}")
    return Strategy(tp=tp, pp=pp, dp=dp, cp=cp, global_batch=global_batch or dp * micro_batch * max(1, 2 * pp),
                    micro_batch=micro_batch, schedule=schedule,
                    virtual_stages=virtual_stages or (2 if schedule == "interleaved" else 1), **recipe)
