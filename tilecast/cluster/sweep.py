"""Sweeps: one configuration re-evaluated while one hardware or strategy parameter varies.

The hardware sweeps are those of MAD Max (Hsia et al., "MAD Max Beyond
Single-Node: Enabling Large Machine Learning Model Acceleration on Distributed
Systems", ISCA 2024, arXiv:2310.02784): scale-up (NVLink) domain size, NICs per
node, HBM capacity and bandwidth, peak FLOPs; each row carries the share of the
step that communication not hidden behind compute takes (that paper finds 14-32%
of GPU hours spent so in production training) and says when the layout no longer
fits in memory.
"""

from __future__ import annotations

from tilecast.cluster.evaluate import evaluate
from tilecast.cluster.hardware import ClusterError
from tilecast.cluster.strategy import Strategy, StrategyError

# Hardware what-ifs: multipliers of the cluster's figures (Cluster.scaled keywords).
HARDWARE = {
    "network_bw": "network_bandwidth",
    "nvlink_bw": "nvlink_bandwidth",
    "flops": "flops",
    "hbm_bw": "hbm_bandwidth",
    "memory": "memory",
    "network_latency": "network_latency",
}
# Hardware what-ifs set to a value: GPUs per NVLink (scale-up) domain, NICs per node, HBM capacity in GB as
# datasheets count it (binary, as the cluster files take it: 80 -> 80 GiB = 85.9e9 bytes, an H100's).
HARDWARE_SET = {"nvlink_domain": int, "nics_per_node": int, "hbm_gb": float}
HARDWARE_PARAMS = sorted(HARDWARE) + sorted(HARDWARE_SET)


def hardware_point(cluster, param: str, value):
    """``cluster`` with one hardware figure changed (:data:`HARDWARE` multipliers, :data:`HARDWARE_SET` values)."""
    if param in HARDWARE:
        return cluster.scaled(**{HARDWARE[param]: float(value)})
    if param == "nvlink_domain":
        return cluster.with_scale_up_domain(value)
    if param == "nics_per_node":
        return cluster.with_nics(value)
    if param == "hbm_gb":
        return cluster.with_memory_bytes(float(value) * 2**30)
    raise KeyError(param)


def _flag(s: str) -> bool:
    return s.lower() in ("1", "true", "yes", "on")


# Strategy what-ifs: Strategy fields, parsed as these types.
STRATEGY = {
    "tp": int, "pp": int, "dp": int, "micro_batch": int, "global_batch": int, "seq": int, "zero": int,
    "virtual_stages": int, "schedule": str, "recompute": str, "sequence_parallel": _flag, "dtype": str,
    "attention": str, "collective_algo": str, "tp_comm_overlap": _flag, "overlap_grad_reduce": _flag, "overlap_param_gather": _flag,
    "pipeline_split": str, "grad_reduce_bytes": int,
    # experts, context parallelism, hybrid sharding
    "ep": int, "cp": int, "capacity_factor": float, "expert_imbalance": float, "shard_group": int,
}
# Strategy fields that change the GPUs one data-parallel replica spans: with ``gpus`` given, dp follows.
MODEL_RANKS = ("tp", "pp", "cp")
PARAMS = HARDWARE_PARAMS + sorted(STRATEGY)


def parse_values(param: str, text: str) -> list:
    """``network_bw=0.5,1,2,4`` -> [0.5, 1.0, 2.0, 4.0]; ``x0.5..x4`` doubles from 0.5 to 4;
    ``nvlink_domain=4..64`` -> [4, 8, 16, 32, 64]. Raises ValueError on values that cannot be read or
    hardware figures that are not positive."""
    text = text.strip()
    hw = param in HARDWARE or param in HARDWARE_SET
    conv = HARDWARE_SET.get(param) or STRATEGY.get(param, float)
    if hw and ".." in text:
        lo, hi = (float(x.strip().lstrip("x")) for x in text.split(".."))
        if not 0 < lo <= hi:
            raise ValueError(f"{param}: range {text!r} must go from a positive value up")
        vals, x = [], lo
        while x <= hi * (1 + 1e-9):
            vals.append(conv(x) if conv is not int or x == int(x) else _bad(param, x))
            x *= 2
        return vals
    vals = [conv(v.strip().lstrip("x") if hw else v.strip()) for v in text.split(",") if v.strip()]
    if hw and any(v <= 0 for v in vals):
        raise ValueError(f"{param}: hardware figures must be positive")
    return vals


def _bad(param, x):
    raise ValueError(f"{param}: {x:g} is not a whole number")


def sweep(shape, strat: Strategy, cluster, param: str, values: list, gpus: int = 0) -> list:
    """Rows ``{param: value, result or error}``. When TP, PP or CP varies and ``gpus`` is
    given, DP is recomputed so that tp x cp x pp x dp = gpus. EP (expert parallelism) keeps dp: its ranks
    are data-parallel ranks, so a value that does not divide dp (or the experts) is an ``error`` row."""
    rows = []
    for v in values:
        c, st = cluster, strat
        if param in HARDWARE or param in HARDWARE_SET:
            try:
                c = hardware_point(cluster, param, v)
            except ClusterError as e:
                rows.append({"value": v, "error": str(e)})
                continue
        else:
            st = strat.with_(**{param: v})
            if gpus and param in MODEL_RANKS:
                model_ranks = st.tp * st.pp * st.cp  # the GPUs one data-parallel replica spans
                if gpus % model_ranks:
                    rows.append({"value": v, "error": f"tp x pp x cp = {model_ranks} does not divide {gpus} GPUs"})
                    continue
                st = st.with_(dp=gpus // model_ranks)
        try:
            rows.append({"value": v, "result": evaluate(shape, st, c)})
        except StrategyError as e:
            rows.append({"value": v, "error": str(e)})
    return rows


def sweep_table(param: str, rows: list):
    """The rows of :func:`sweep` as a DataFrame: the swept value, step figures, breakdown, the exposed-communication
    share of the step, memory, fit and a ``note`` (what it would need when it does not fit); ``error``: why a row
    has no result (a value the layout or the hardware cannot take)."""
    import pandas as pd

    table = []
    for row in rows:
        r = row.get("result")
        rec = {param: row["value"]}
        if r is None:
            rec["error"] = row["error"]
        else:
            rec.update(step_s=r.step_s, tokens_per_s=r.tokens_per_s, tflops_per_gpu=r.tflops_per_gpu, mfu=r.mfu, hfu=r.hfu,
                       **{k: v for k, v in r.breakdown.items() if k.endswith("_s")},
                       exposed_comm_share=r.breakdown["exposed_comm_s"] / r.step_s,
                       memory_per_gpu_bytes=r.memory_per_gpu_bytes, fits=r.fits,
                       note=fit_note(r.fits, r.memory_per_gpu_bytes, r.memory_capacity_bytes))
        table.append(rec)
    return pd.DataFrame(table)


def fit_note(fits: bool, need: float, capacity: float) -> str:
    """'' when it fits, else what it would need (a sweep row's ``note``)."""
    return "" if fits else f"does not fit: needs {need / 1e9:.1f} GB per GPU of {capacity / 1e9:.1f} GB"


TRAINING_PARTS = ("compute_s", "exposed_comm_s", "bubble_s", "optimizer_s")


def plot_sweeps(sweeps: list, path: str, parts=TRAINING_PARTS, throughput: str = "tokens_per_s",
                unit: str = "seconds per step") -> None:
    """One row of panels per swept parameter: throughput with the exposed-communication share (right axis),
    and the breakdown as stacked bars. Values without a result or that do not fit are marked on the x axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(sweeps), 2, figsize=(11, 3.6 * len(sweeps)), squeeze=False)
    for (param, df), (a1, a2) in zip(sweeps, axes):
        ok = df[df[throughput].notna()] if throughput in df else df.iloc[0:0]
        fits = ok["fits"].to_numpy(dtype=bool) if "fits" in ok else None
        labels = [str(v) + ("" if fits is None or f else "\n(no fit)") for v, f in
                  zip(ok[param], fits if fits is not None else [True] * len(ok))]
        a1.plot(labels, ok[throughput] if len(ok) else [], marker="o", label=throughput.replace("_", " "))
        a1.set_xlabel(param)
        a1.set_ylabel(throughput.replace("_per_s", "/s").replace("_", " "))
        a1.set_title(f"throughput vs {param}")
        if "exposed_comm_share" in ok and len(ok):
            a3 = a1.twinx()
            a3.plot(labels, 100 * ok["exposed_comm_share"], marker="s", color="tab:red")
            a3.set_ylabel("exposed communication, % of time", color="tab:red")
            a3.set_ylim(bottom=0)
        bottom = None
        for part in parts:
            if part in ok:
                vals = ok[part].to_numpy(dtype=float)
                a2.bar(labels, vals, bottom=bottom, label=part[:-2].replace("_", " "))
                bottom = vals if bottom is None else bottom + vals
        a2.set_xlabel(param)
        a2.set_ylabel(unit)
        a2.set_title("breakdown")
        a2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
