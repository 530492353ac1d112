"""Where a prediction went wrong: the groups of tasks that account for most of the difference.

The difference of a group is the sum of its tasks' predicted minus measured
durations; its share is its absolute difference over the sum of all groups'
absolute differences, so shares add up to 1 and a group that was predicted too
fast does not cancel one predicted too slow.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

_DIGITS = re.compile(r"\d+")


def phase_of(tag: str) -> str:
    """A tag with its numbers replaced by ``*``, so one phase gathers every layer ("h3/attn" -> "h*/attn")."""
    return _DIGITS.sub("*", str(tag))


def attribute(pairs: pd.DataFrame, by: str) -> pd.DataFrame:
    """Rank groups of paired tasks by |pred_s - real_s| summed over the group.

    ``by``: ``"kernel"``, ``"tag"`` or ``"phase"`` (the tag with numbers
    replaced by ``*``). Columns: the group, ``tasks``, ``pred_s``, ``real_s``,
    ``diff_s``, ``share`` (of the total absolute difference), ``cum_share``.
    """
    keys = pairs["tag"].map(phase_of) if by == "phase" else pairs[by]
    g = pairs.assign(_key=keys.to_numpy()).groupby("_key", sort=True)
    out = pd.DataFrame({
        "tasks": g.size(),
        "pred_s": g["pred_s"].sum(),
        "real_s": g["real_s"].sum(),
    })
    out["diff_s"] = out["pred_s"] - out["real_s"]
    total = float(out["diff_s"].abs().sum())
    out["share"] = out["diff_s"].abs() / total if total > 0 else 0.0
    out = out.iloc[np.argsort(-out["diff_s"].abs().to_numpy(), kind="stable")]
    out["cum_share"] = out["share"].cumsum()
    out.index.name = by
    return out.reset_index()
