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

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

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
        for f in ("tp", "pp", "dp", "seq", "global_batch", "micro_batch", "virtual_stages"):
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
        if self.sequence_parallel and self.seq % self.tp:
            raise StrategyError(f"sequence_parallel: seq {self.seq} is not a multiple of tp {self.tp}")
        if cluster is not None:
            if self.gpus > cluster.n_gpus:
                raise StrategyError(f"gpus: tp x pp x dp = {self.gpus} exceeds the {cluster.n_gpus} GPUs of {cluster.name}")
            if self.dtype not in cluster.gpu.peak_flops:
                raise StrategyError(f"dtype: {cluster.gpu.name} has no {self.dtype} peak in {cluster.name}")
            g = cluster.gpus_per_node
            if self.tp > g and self.tp % g:
                raise StrategyError(f"tp: {self.tp} spans nodes unevenly ({g} GPUs per node)")
            if self.tp < g and g % self.tp:
                raise StrategyError(f"tp: {self.tp} does not divide the {g} GPUs of a node")
        return self


def layout(gpus: int = 0, tp: int = 1, pp: int = 1, dp: int = 0, global_batch: int = 0, micro_batch: int = 1,
           schedule: str = "1f1b", virtual_stages: int = 0, **recipe) -> Strategy:
    """The Strategy a user means by counts left at 0: ``dp`` = ``gpus / (tp pp)`` (1 without ``gpus``),
    ``global_batch`` = dp x micro_batch x 2pp, ``virtual_stages`` 2 when interleaved (else 1). ``recipe``:
    the other Strategy fields. Not checked against a model (:meth:`Strategy.check`)."""
    tp, pp = tp or 1, pp or 1
    if not isinstance(micro_batch, int) or isinstance(micro_batch, bool) or micro_batch < 1:
        raise StrategyError(f"micro_batch: must be a whole number >= 1, got {micro_batch!r}")
    if not dp:
        if gpus and gpus % (tp * pp):
            raise StrategyError(f"gpus: {gpus} is not a multiple of tp x pp = {tp * pp}")
        dp = gpus // (tp * pp) if gpus else 1
    elif gpus and gpus != tp * pp * dp:
        raise StrategyError(f"gpus: {gpus} differs from tp x pp x dp = {tp * pp * dp}")
    return Strategy(tp=tp, pp=pp, dp=dp, global_batch=global_batch or dp * micro_batch * max(1, 2 * pp),
                    micro_batch=micro_batch, schedule=schedule,
                    virtual_stages=virtual_stages or (2 if schedule == "interleaved" else 1), **recipe)
