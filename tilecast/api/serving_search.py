"""``tc.whatif_inference_search``: the serving layouts (TP x PP x DP, and EP for a mixture of experts) of a model
on a number of GPUs with the highest output tokens/s (``tilecast whatif --inference --search``). Bad input raises
a ValueError whose message starts with the argument at fault (FieldError, InferenceError, ClusterError)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tilecast.api.base import _positive, _Result
from tilecast.errors import FieldError

# the fields of a serving configuration a baseline may set (the others are the search's template's)
BASELINE_FIELDS = ("tp", "pp", "dp", "batch", "weight_dtype", "kv_dtype", "ep")


def _serving_rows(results) -> list:
    """One row per cluster.inference.InferenceResult: its configuration, figures and breakdown."""
    rows = []
    for r in results:
        d = r.to_dict()
        rows.append({**d["config"], **{k: v for k, v in d.items() if not isinstance(v, dict)}, **d["breakdown"]})
    return rows


@dataclass
class InferenceSearchResult(_Result):
    """The fastest serving layouts (``tilecast whatif --inference --search``): ``top`` best first (empty when
    none fits), ``to_frame()`` one row per layout; with a ``baseline``, its result and ``gain`` (the best
    layout's output tokens/s over the baseline's); ``sweeps``: per hardware parameter swept, the best layout
    at each point (a DataFrame, :func:`tilecast.cluster.inference_search.inference_search_sweep_table`)."""

    model: str
    cluster: str
    engine: str
    gpus: int
    candidates: int
    fitting: int
    gain: float | None = None
    top: list = field(repr=False, default_factory=list)  # cluster.inference.InferenceResult, best first
    baseline: object = field(repr=False, default=None)
    sweeps: dict = field(repr=False, default_factory=dict)
    template: object = field(repr=False, default=None)  # the InferenceConfig whose layout is searched

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(_serving_rows(self.top))

    def _headline(self) -> str:
        return (f"{self.model} served on {self.gpus} x {self.cluster} ({self.engine}): {self.candidates} layouts, "
                f"{self.fitting} fit")


def _baseline(fields: dict, template, gpus: int, shape, cluster):
    """The baseline InferenceConfig: ``template`` with ``fields`` replaced; dp = gpus / (tp pp) unless given."""
    bad = [k for k in fields if k not in BASELINE_FIELDS]
    if bad:
        raise FieldError(f"baseline: unknown field {bad[0]!r} (one of {', '.join(BASELINE_FIELDS)})")
    fields = dict(fields)
    tp, pp = fields.get("tp", template.tp), fields.get("pp", template.pp)
    if "dp" not in fields:
        if gpus % (tp * pp):
            raise FieldError(f"baseline: gpus {gpus} is not a multiple of tp x pp = {tp} x {pp}")
        fields["dp"] = gpus // (tp * pp)
    base = replace(template, **fields)
    if base.gpus != gpus:
        raise FieldError(f"baseline: tp x pp x dp = {base.gpus} differs from gpus {gpus}")
    from tilecast.cluster.inference import InferenceError

    try:
        return base.check(shape, cluster)
    except InferenceError as e:
        raise FieldError(f"baseline: {e}") from None


def whatif_inference_search(model="llama3-70b", cluster="dgx-h100", gpus: int = 8, top: int = 10, baseline=None,
                            sweeps=None, **serving) -> InferenceSearchResult:
    """Search the serving layouts of ``model`` on ``gpus`` GPUs of ``cluster`` (``tilecast whatif --inference
    --search``) and keep the ``top`` fastest that fit; ``serving``: the other arguments of
    :func:`tilecast.api.cluster_calls.whatif_inference` (``batch`` 0: the largest batch that fits each layout,
    ``input_len``, ``output_len``, ``dtype``, ``kv_dtype``, ``engine``, ``max_batch``, ...; the layout's
    ``tp``, ``pp``, ``dp`` only start the search). ``baseline``: {field: value} of a configuration to compare
    the best with (``tp``, ``pp``, ``dp``, ``batch``, ``weight_dtype``, ``kv_dtype``, ``ep``; dp from the GPUs
    unless given); ``sweeps``: hardware parameters ({param: values}, :func:`tilecast.api.sweeps.sweep_values`),
    the search again at each point."""
    from tilecast.api.base import _config
    from tilecast.api.cluster_calls import cluster_of, whatif_inference
    from tilecast.api.sweeps import sweep_values
    from tilecast.cluster.inference_search import (inference_search, inference_search_sweep,
                                                   inference_search_sweep_table)
    from tilecast.cluster.sweep import HARDWARE_PARAMS

    _positive("gpus", gpus)
    _positive("top", top)
    if serving.get("request_rate"):
        raise FieldError("request_rate: the search compares fixed batches (leave it at 0)")
    start = whatif_inference(model, cluster, gpus=gpus, **serving)  # the template, checked
    c, shape, cfg, eff = cluster_of(cluster), _config(model), start.config, start.efficiency
    base = None if baseline is None else _baseline(baseline, cfg, gpus, shape, c)
    specs = [] if not sweeps else sweep_values(sweeps, HARDWARE_PARAMS,
                                               context=" with search (hardware parameters only)")
    res = inference_search(shape, c, cfg, gpus, eff, top=top, baseline=base)
    tables = {p: inference_search_sweep_table(p, inference_search_sweep(shape, c, cfg, gpus, eff, p, v,
                                                                        baseline=base)) for p, v in specs}
    return InferenceSearchResult(shape.name, c.name, start.engine, gpus, res["candidates"], res["fitting"],
                                 res.get("gain"), list(res["top"]), res.get("baseline"), tables, cfg)
