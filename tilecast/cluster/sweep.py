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
