"""Sweeps: one configuration re-evaluated while one hardware or strategy parameter varies."""

from __future__ import annotations

from tilecast.cluster.evaluate import evaluate
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
def _flag(s: str) -> bool:
    return s.lower() in ("1", "true", "yes", "on")


# Strategy what-ifs: Strategy fields, parsed as these types.
STRATEGY = {
    "tp": int, "pp": int, "dp": int, "micro_batch": int, "global_batch": int, "seq": int, "zero": int,
    "virtual_stages": int, "schedule": str, "recompute": str, "sequence_parallel": _flag, "dtype": str,
    "attention": str, "collective_algo": str, "tp_comm_overlap": _flag, "overlap_grad_reduce": _flag, "overlap_param_gather": _flag,
    "pipeline_split": str, "grad_reduce_bytes": int,
}
PARAMS = sorted(HARDWARE) + sorted(STRATEGY)


def parse_values(param: str, text: str) -> list:
    """``network_bw=0.5,1,2,4`` -> [0.5, 1.0, 2.0, 4.0]; ``x0.5..x4`` doubles from 0.5 to 4."""
    text = text.strip()
    if param in HARDWARE and ".." in text:
        lo, hi = (float(x.strip().lstrip("x")) for x in text.split(".."))
        vals, x = [], lo
        while x <= hi * (1 + 1e-9):
            vals.append(x)
            x *= 2
        return vals
    conv = STRATEGY.get(param, float)
    return [conv(v.strip().lstrip("x") if param in HARDWARE else v.strip()) for v in text.split(",") if v.strip()]


def sweep(shape, strat: Strategy, cluster, param: str, values: list, gpus: int = 0) -> list:
    """Rows ``{param: value, result or error}``. When TP or PP varies and ``gpus`` is
    given, DP is recomputed so that tp x pp x dp = gpus."""
    rows = []
    for v in values:
        c, st = cluster, strat
        if param in HARDWARE:
            c = cluster.scaled(**{HARDWARE[param]: float(v)})
        else:
            st = strat.with_(**{param: v})
            if gpus and param in ("tp", "pp"):
                if gpus % (st.tp * st.pp):
                    rows.append({"value": v, "error": f"tp x pp = {st.tp * st.pp} does not divide {gpus} GPUs"})
                    continue
                st = st.with_(dp=gpus // (st.tp * st.pp))
        try:
            rows.append({"value": v, "result": evaluate(shape, st, c)})
        except StrategyError as e:
            rows.append({"value": v, "error": str(e)})
    return rows


def sweep_table(param: str, rows: list):
    """The rows of :func:`sweep` as a DataFrame: the swept value, step figures, breakdown, memory, fit."""
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
                       memory_per_gpu_bytes=r.memory_per_gpu_bytes, fits=r.fits)
        table.append(rec)
    return pd.DataFrame(table)


def plot_sweeps(sweeps: list, path: str) -> None:
    """One row of panels per swept parameter: tokens/s, and the step's breakdown as stacked bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(sweeps), 2, figsize=(11, 3.6 * len(sweeps)), squeeze=False)
    parts = ["compute_s", "exposed_comm_s", "bubble_s", "optimizer_s"]
    for (param, df), (a1, a2) in zip(sweeps, axes):
        ok = df[df["step_s"].notna()] if "step_s" in df else df.iloc[0:0]
        labels = [str(v) for v in ok[param]]
        a1.plot(labels, ok["tokens_per_s"] if len(ok) else [], marker="o")
        a1.set_xlabel(param)
        a1.set_ylabel("tokens/s")
        a1.set_title(f"throughput vs {param}")
        bottom = None
        for part in parts:
            if part in ok:
                vals = ok[part].to_numpy()
                a2.bar(labels, vals, bottom=bottom, label=part[:-2].replace("_", " "))
                bottom = vals if bottom is None else bottom + vals
        a2.set_xlabel(param)
        a2.set_ylabel("seconds per step")
        a2.set_title("step breakdown")
        a2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
