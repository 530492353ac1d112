"""``tc.validate`` and ``tc.validate_inference``: the cluster model against published runs (``tilecast validate``).

Errors are fractions, predicted / published - 1. Only held-out rows (role ``validation``, never fitted) decide
``ok``. A table that cannot be read raises :class:`tilecast.errors.FieldError` naming the argument (``table``,
``inference_table``), so that the command maps it to its flag.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from tilecast.api.base import _Result
from tilecast.errors import FieldError


def _read_table(load, path: str, name: str, table_error) -> list:
    """The rows of a validation table read by ``load``; FieldError naming ``name`` for a table that is missing,
    not YAML, or has a row the model cannot take (the loaders check rows as they build them)."""
    import yaml

    from tilecast.cluster.inference import InferenceError
    from tilecast.cluster.strategy import StrategyError

    try:
        return load(path)
    except FileNotFoundError:
        raise FieldError(f"{name}: no such file {path}") from None
    except OSError as e:
        raise FieldError(f"{name}: cannot read {path} ({e.strerror or e})") from None
    except (yaml.YAMLError, AttributeError) as e:  # not YAML, or YAML that is not a mapping of runs
        raise FieldError(f"{name}: {path} is not a table of runs ({str(e).splitlines()[0]})") from None
    except (table_error, StrategyError, InferenceError) as e:
        raise FieldError(f"{name}: {e}") from None
    except (TypeError, ValueError) as e:  # a row's field of the wrong kind (float("x"), an unknown keyword)
        raise FieldError(f"{name}: {path}: a row cannot be read ({e})") from None


def _predicted(compare, runs):
    """``compare(runs)``; FieldError naming ``table`` for a row naming a cluster or model that does not exist,
    or a configuration the model cannot take."""
    from tilecast.cluster.hardware import ClusterError
    from tilecast.cluster.inference import InferenceError
    from tilecast.cluster.strategy import StrategyError
    from tilecast.graph.model_config import ModelConfigError

    try:
        return compare(runs)
    except (ClusterError, ModelConfigError, StrategyError, InferenceError) as e:
        raise FieldError(f"table: {e}") from None


def _positive_fraction(name: str, v) -> None:
    if v is not None and not v > 0:
        raise FieldError(f"{name}: must be positive, got {v}")


@dataclass
class ValidateResult(_Result):
    """The cluster model against published training runs (``tilecast validate``); ``to_frame()`` has one row
    per run: published, predicted, error (and ``lopo_error``, the leave-one-publication-out prediction's).
    Only held-out rows (never fitted) decide ``ok``; errors are fractions. ``note``: why the
    leave-one-publication-out figures are absent, if they are."""

    median_abs_error_heldout: float
    median_abs_error_fitted: float
    median_abs_error_lopo: float | None
    target: float
    lopo_target: float | None
    ok: bool
    sources: list
    scorecard: dict = field(repr=False, default_factory=dict)  # every figure of validate --json
    runs: object = field(repr=False, default=None)  # DataFrame
    note: str = ""

    def to_frame(self):
        return self.runs.copy()

    def _headline(self) -> str:
        lopo = ("" if self.median_abs_error_lopo is None
                else f", leave-one-publication-out {100 * self.median_abs_error_lopo:.1f}%")
        return (f"median |error| {100 * self.median_abs_error_heldout:.1f}% over held-out runs{lopo}; "
                f"{'met' if self.ok else 'NOT met'}")


def validate(table: str | None = None, target: float = 0.08, lopo_target: float | None = None,
             max_error: float | None = None, refit_lopo: bool = False) -> ValidateResult:
    """Predict the published runs of ``table`` (default: the shipped one) and compare (``tilecast validate``).
    The leave-one-publication-out folds are the stored ones for the shipped table, refitted with
    ``refit_lopo`` (minutes), absent otherwise (``note`` says so)."""
    from tilecast.cluster.lopo import StaleFoldsError, lopo_errors
    from tilecast.cluster.validation import RUNS, ValidationTableError, compare as compare_runs, load_runs, scorecard

    for name, v in (("target", target), ("lopo_target", lopo_target), ("max_error", max_error)):
        _positive_fraction(name, v)
    path = table or RUNS
    runs = _read_table(load_runs, path, "table", ValidationTableError)
    if not runs:
        raise FieldError(f"table: no rows in {path}")
    df = _predicted(compare_runs, runs)
    lopo, note = None, ""
    if table is None or refit_lopo:
        try:
            lopo = lopo_errors(runs, "refit" if refit_lopo else None)
        except StaleFoldsError as e:
            raise FieldError(f"refit_lopo: {e}") from None
        except OSError as e:
            raise FieldError(f"refit_lopo: no stored leave-one-publication-out folds ({e.strerror}: {e.filename}); "
                             "python3 -m tilecast.cluster.calibrate --lopo writes them") from None
    else:
        note = "leave-one-publication-out: no stored folds for this table (refit_lopo fits them)"
    try:
        card = scorecard(df, lopo, target, lopo_target, max_error)
    except ValidationTableError as e:
        raise FieldError(f"table: {e}") from None
    if lopo is not None:
        df = df.merge(lopo[["id", "error"]].rename(columns={"error": "lopo_error"}), on="id")
    return ValidateResult(card["median_abs_error_heldout"], card["median_abs_error_fitted"],
                          card["median_abs_error_lopo"], target, lopo_target, card["ok"], card["sources"], card, df,
                          note)


@dataclass
class InferenceValidateResult(_Result):
    """Published serving figures against ``tc.whatif_inference`` (the inference part of ``tilecast validate``):
    ``to_frame()`` has one row per run (published, predicted, error); the targets count validation rows only;
    ``ok`` is True when there is no validation row. ``summary`` is ``validate --json``'s ``inference`` object."""

    median_abs_error: float | None  # over all rows
    median_abs_error_validation_rows: float | None
    max_abs_error_validation_rows: float | None
    target: float
    max_error: float
    ok: bool
    rows_beyond_max_error: list
    sources: list
    runs: object = field(repr=False, default=None)  # DataFrame
    summary: dict = field(repr=False, default_factory=dict)

    def to_frame(self):
        return self.runs.copy()

    def _headline(self) -> str:
        if self.median_abs_error_validation_rows is None:
            return f"inference: {len(self.runs)} rows, no validation row"
        return (f"inference: median |error| {100 * self.median_abs_error_validation_rows:.1f}% over validation "
                f"rows; {'met' if self.ok else 'NOT met'}")


def validate_inference(table: str | None = None, role: str = "all", target: float = 0.15,
                       max_error: float = 0.35) -> InferenceValidateResult:
    """Predict the published serving runs of ``table`` (default: the shipped one) with ``whatif_inference``
    and compare; ``role``: all, validation or calibration rows; ``target``: the largest acceptable median
    |error| of the validation rows, ``max_error`` of any one of them."""
    import pandas as pd

    from tilecast.cluster.inference_validation import (INFERENCE_RUNS, InferenceTableError, compare_inference,
                                                       load_inference_runs, median_abs_error)

    if role not in ("all", "validation", "calibration"):
        raise FieldError(f"role: must be all, validation or calibration, got {role!r}")
    for name, v in (("target", target), ("max_error", max_error)):
        _positive_fraction(name, v)
    path = table or INFERENCE_RUNS
    runs = _read_table(load_inference_runs, path, "table", InferenceTableError)
    if role != "all":
        runs = [r for r in runs if r.role == role]
    if not runs:
        empty = {"runs": []}
        return InferenceValidateResult(None, None, None, target, max_error, True, [], [], pd.DataFrame(), empty)
    df = _predicted(compare_inference, runs)
    val = df[df.role == "validation"]
    med_val = median_abs_error(val) if len(val) else None
    worst = float(val.error.abs().max()) if len(val) else None
    ok = not len(val) or (med_val <= target and worst <= max_error)
    beyond = sorted(val[val.error.abs() > max_error].id) if len(val) else []
    summary = {"runs": json.loads(df.to_json(orient="records")), "median_abs_error": median_abs_error(df),
               # null, not NaN (which is not JSON), when no validation row was predicted
               "median_abs_error_validation_rows": med_val, "max_abs_error_validation_rows": worst,
               "target": target, "max_error": max_error, "ok": bool(ok), "rows_beyond_max_error": beyond,
               "sources": sorted(set(df.source))}
    return InferenceValidateResult(summary["median_abs_error"], med_val, worst, target, max_error, bool(ok), beyond,
                                   summary["sources"], df, summary)
