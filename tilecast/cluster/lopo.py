"""Leave-one-publication-out errors: each publication's rows predicted by a fit that never saw it.

The folds' fitted figures are computed by ``python3 -m tilecast.cluster.calibrate
--lopo`` (a few minutes: one fit per publication on every row of the others) and
stored in ``validation/lopo.yaml`` with a digest of the table (and of its models'
shapes) they were fitted on; :func:`lopo_errors` predicts with them (seconds) and refuses stale folds.
"""

from __future__ import annotations

import os

import yaml

from tilecast.cluster.calibrate import LOPO_FILE, fitted_clusters, lopo_fits, table_digest
from tilecast.cluster.validation import RUNS, compare


class StaleFoldsError(ValueError):
    """The stored folds were fitted on another version of the validation table."""


def stored_folds(path: str = LOPO_FILE, table: str = RUNS) -> dict:
    """Publication -> {cluster name -> fitted figures}, from ``path``; checked against ``table``'s digest."""
    with open(path) as f:
        doc = yaml.safe_load(f)
    if doc.get("table_sha256_16") != table_digest(table):
        raise StaleFoldsError(f"{os.path.basename(path)} was fitted on another version of "
                              f"{os.path.basename(table)}; rerun python3 -m tilecast.cluster.calibrate --lopo")
    return doc["folds"]


def lopo_errors(runs, folds: dict = None):
    """A DataFrame as :func:`validation.compare` gives, each row predicted by its publication's fold.

    ``folds``: publication -> {cluster -> figures}; None reads the stored ones (shipped table only);
    the string ``"refit"`` fits them now (minutes).
    """
    import pandas as pd

    if folds is None:
        folds = stored_folds()
    elif folds == "refit":
        folds = {src: {name: f["params"] for name, f in fits.items()} for src, fits in lopo_fits(runs).items()}
    parts = []
    for src in sorted({r.source for r in runs}):
        if src not in folds:
            raise StaleFoldsError(f"no fold leaves out publication {src}")
        clusters = fitted_clusters({name: {"params": p} for name, p in folds[src].items()})
        parts.append(compare([r for r in runs if r.source == src], clusters))
    return pd.concat(parts, ignore_index=True)
