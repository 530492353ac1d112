"""How well predicted step times rank configurations, over a suite of predicted/measured pairs.

Used to judge a tuner: are the errors small, is the predicted order the
measured order, and is the configuration predicted best also (nearly) the
fastest measured?
"""

from __future__ import annotations

import numpy as np
from scipy.stats import kendalltau


def ranking_accuracy(predicted, measured) -> dict:
    """Figures for configurations i with predicted time ``predicted[i]`` and measured ``measured[i]``.

    - ``median_abs_error``, ``max_abs_error``: of |predicted - measured| / measured;
    - ``kendall_tau``: Kendall's tau-b between the two orders (scipy.stats.kendalltau),
      1 when they agree, -1 when reversed; None for fewer than two configurations;
    - ``best_gap``: (measured time of the predicted-best configuration - best
      measured time) / best measured time; 0 when the prediction picks the fastest;
    - ``predicted_best``, ``measured_best``: their indices.
    """
    p = np.asarray(predicted, dtype=float)
    m = np.asarray(measured, dtype=float)
    if p.shape != m.shape or p.ndim != 1 or p.size == 0:
        raise ValueError(f"need two equally long, non-empty lists of times, got {p.shape} and {m.shape}")
    if (m <= 0).any():
        raise ValueError("measured times must be positive")
    err = np.abs(p - m) / m
    pb, mb = int(np.argmin(p)), int(np.argmin(m))
    tau = float(kendalltau(p, m).statistic) if p.size > 1 else None
    return {
        "median_abs_error": float(np.median(err)),
        "max_abs_error": float(err.max()),
        "kendall_tau": None if tau is None or np.isnan(tau) else tau,
        "best_gap": float((m[pb] - m[mb]) / m[mb]),
        "predicted_best": pb,
        "measured_best": mb,
    }
