"""``tc.whatif_sweep``: one distributed-training layout with one parameter varied at a time, hardware (as MAD Max
sweeps it) or strategy (``tilecast whatif --sweep``). Bad input raises a ValueError whose message starts with
the argument at fault (``sweep: ...``, or the layout's own field)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tilecast.api.base import _config, _Result
from tilecast.errors import FieldError


def sweep_values(sweeps, params, parse=None, context: str = "") -> list:
    """``[(param, values)]`` of ``sweeps``: a {param: values} dict or (param, values) pairs, each ``values`` a
    list or the text ``tilecast whatif --sweep`` takes after ``PARAM=`` (``x0.5..x4``, ``1,2,4``); ``params``:
    the parameters that may be swept; ``parse(param, text)``: their values (default
    :func:`tilecast.cluster.sweep.parse_values`); ``context``: what the parameter list applies to, for the
    error (e.g. " with search (hardware parameters only)")."""
    from tilecast.cluster.sweep import parse_values

    parse = parse or parse_values
    pairs = list(sweeps.items()) if isinstance(sweeps, dict) else list(sweeps)
    if not pairs:
        raise FieldError("sweep: no parameter to sweep")
    out = []
    for pair in pairs:
        try:
            param, values = pair
        except (TypeError, ValueError):
            raise FieldError(f"sweep: expected (parameter, values) pairs, got {pair!r}") from None
        param = str(param).strip().replace("-", "_")
        if param not in params:
            raise FieldError(f"sweep: unknown parameter {param!r}{context} (one of {', '.join(params)})")
        if isinstance(values, str):
            try:
                values = parse(param, values)
            except ValueError:
                raise FieldError(f"sweep: cannot read the values of {param} from {values!r}") from None
        values = list(values)
        if not values:
            raise FieldError(f"sweep: no values for {param}")
        out.append((param, values))
    return out


@dataclass
class WhatifSweepResult(_Result):
    """A layout evaluated as each swept parameter varies (``tilecast whatif --sweep``): ``base`` is the layout
    unchanged (:class:`tilecast.api.cluster_calls.WhatifResult`), ``tables`` one DataFrame per swept parameter
    (:func:`tilecast.cluster.sweep.sweep_table`: the value, tokens/s, the breakdown, exposed communication,
    fits and a note); ``to_frame()`` the tables one after the other with a ``param`` column; ``summary`` the
    ``sweeps`` key of ``whatif --sweep --json``."""

    model: str
    cluster: str
    gpus: int
    params: list
    base: object = field(repr=False, default=None)
    tables: dict = field(repr=False, default_factory=dict)
    summary: dict = field(repr=False, default_factory=dict)

    def to_frame(self):
        import pandas as pd

        return pd.concat([t.assign(param=p) for p, t in self.tables.items()], ignore_index=True)

    def plot(self, path: str) -> None:
        """The sweeps' plot (tokens/s, exposed-communication share, breakdown) written to ``path`` (.png)."""
        from tilecast.cluster.sweep import plot_sweeps

        plot_sweeps(list(self.tables.items()), path)

    def _headline(self) -> str:
        return f"{self.model} on {self.gpus} x {self.cluster}: {', '.join(self.params)} swept"


def whatif_sweep(model="gpt3-175b", cluster="dgx-a100", sweeps=None, gpus: int = 0, seq: int = 2048,
                 global_batch: int = 0, micro_batch: int = 1, tp: int = 1, pp: int = 1, dp: int = 0,
                 **recipe) -> WhatifSweepResult:
    """Evaluate the layout of :func:`tilecast.api.whatif` (same arguments) at every value of each swept
    parameter (``sweeps``: {param: values}, see :func:`sweep_values`; hardware parameters such as
    ``network_bw``, ``nvlink_domain``, ``hbm_gb`` or strategy fields such as ``tp``, ``schedule``, ``ep``).
    When TP, PP or CP varies with ``gpus`` given, DP follows so that the GPUs stay the same; a value the
    layout cannot take is a row with its ``error``."""
    import json

    from tilecast.api.cluster_calls import cluster_of, whatif
    from tilecast.cluster.sweep import PARAMS, sweep, sweep_table

    specs = sweep_values(sweeps if sweeps is not None else {}, PARAMS)
    base = whatif(model, cluster, gpus=gpus, seq=seq, global_batch=global_batch, micro_batch=micro_batch, tp=tp,
                  pp=pp, dp=dp, **recipe)
    c, shape = cluster_of(cluster), _config(model)
    tables = {}
    for param, values in specs:
        tables[param] = sweep_table(param, sweep(shape, base.layout, c, param, values, gpus=gpus))
    summary = {"sweeps": {p: json.loads(t.to_json(orient="records")) for p, t in tables.items()}}
    return WhatifSweepResult(base.model, base.cluster, base.gpus, [p for p, _ in specs], base, tables, summary)
