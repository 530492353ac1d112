"""One configuration (model, layout, cluster) -> step time, breakdown, throughput, memory."""

from __future__ import annotations

from dataclasses import dataclass

from tilecast.cluster import params as P
from tilecast.cluster.costs import layer_costs
from tilecast.cluster.flops import hardware_flops_per_token, model_flops_per_token
from tilecast.cluster.memory import memory_per_gpu
from tilecast.cluster.timeline import breakdown, build_timeline


@dataclass
class Result:
    model: str
    cluster: str
    strategy: dict
    gpus: int
    step_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    hfu: float
    breakdown: dict
    memory: dict
    memory_per_gpu_bytes: float
    memory_capacity_bytes: float
    fits: bool
    n_tasks: int
    params: float = 0.0  # parameters of the model (the cluster's count)
    active_params: float = 0.0  # parameters one token goes through (= params without experts)
    timeline: object = None  # the simulated Timeline (not serialised)

    def to_dict(self) -> dict:
        return {
            "model": self.model, "cluster": self.cluster, "gpus": self.gpus, "strategy": self.strategy,
            "step_s": self.step_s, "tokens_per_s": self.tokens_per_s, "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu, "hfu": self.hfu, "breakdown": self.breakdown, "memory": self.memory,
            "memory_per_gpu_bytes": self.memory_per_gpu_bytes, "memory_capacity_bytes": self.memory_capacity_bytes,
            "fits": self.fits, "n_tasks": self.n_tasks, "params": self.params, "active_params": self.active_params,
        }


def evaluate(shape, strat, cluster) -> Result:
    """Simulate one training step of ``shape`` laid out as ``strat`` on ``cluster``.

    MFU = tokens/s x (6N + 12 L h s) / (GPUs x peak FLOP/s of the dtype), N the active parameters of a
    mixture of experts, see
    :func:`tilecast.cluster.flops.model_flops_per_token`; ``tflops_per_gpu`` is
    the numerator per GPU (model flops, recomputation not counted). HFU counts the
    recomputed forward work too (:func:`tilecast.cluster.flops.hardware_flops_per_token`).
    """
    strat.check(shape, cluster)
    costs = layer_costs(shape, strat, cluster)
    tl = build_timeline(shape, strat, costs).simulate()
    bd = breakdown(tl)
    step = bd.pop("step_s")
    tokens = strat.global_batch * strat.seq
    tps = tokens / step
    flops_per_gpu = tps * model_flops_per_token(shape, strat.seq) / strat.gpus
    mem = memory_per_gpu(shape, strat, cluster)
    return Result(
        model=shape.name, cluster=cluster.name, strategy=strat.to_dict(), gpus=strat.gpus,
        step_s=step, tokens_per_s=tps, tflops_per_gpu=flops_per_gpu / 1e12,
        mfu=flops_per_gpu / cluster.gpu.peak_flops[strat.dtype],
        hfu=tps * hardware_flops_per_token(shape, strat.seq, strat.recompute) / strat.gpus
        / cluster.gpu.peak_flops[strat.dtype],
        breakdown=bd, memory=mem.to_dict(), memory_per_gpu_bytes=mem.total,
        memory_capacity_bytes=cluster.gpu.memory_bytes, fits=mem.total <= cluster.gpu.memory_bytes,
        n_tasks=tl.n_tasks, timeline=tl, params=float(P.n_params(shape)), active_params=float(P.n_active_params(shape)),
    )
