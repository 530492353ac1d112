"""``--sweep PARAM=VALUES`` of ``tilecast whatif``, read the same way for training and ``--inference``."""

from __future__ import annotations

from tilecast.cli import UsageError


def sweep_specs(specs, params, parse_values, context: str = "") -> list:
    """``[(param, values)]`` of the ``--sweep`` arguments ``specs``; ``params``: the parameters that may be swept,
    ``parse_values(param, text)``: their values; ``context``: what the parameter list applies to, for the error
    (e.g. " with --inference")."""
    out = []
    for spec in specs:
        if "=" not in spec:
            raise UsageError(f"--sweep: expected PARAM=VALUES, got {spec!r}")
        param, text = spec.split("=", 1)
        param = param.strip().replace("-", "_")
        if param not in params:
            raise UsageError(f"--sweep: unknown parameter {param!r}{context} (one of {', '.join(params)})")
        try:
            values = parse_values(param, text)
        except ValueError:
            raise UsageError(f"--sweep: cannot read the values of {param} from {text!r}") from None
        if not values:
            raise UsageError(f"--sweep: no values for {param}")
        out.append((param, values))
    return out


def sweep_pairs(specs) -> list:
    """(param, values text) of each ``--sweep PARAM=VALUES``; the library reads the parameter and its values
    (:func:`tilecast.api.sweeps.sweep_values`)."""
    out = []
    for spec in specs:
        if "=" not in spec:
            raise UsageError(f"--sweep: expected PARAM=VALUES, got {spec!r}")
        out.append(tuple(spec.split("=", 1)))
    return out


def layout_fields(text: str, types: dict, flag: str = "--baseline") -> dict:
    """``"tp=8,pp=1,dp=32"`` -> {"tp": 8, "pp": 1, "dp": 32}, each value read as ``types[field]``; ``dp=auto``
    (or ``dp=...``) leaves dp to be derived from the GPUs. Errors name ``flag``."""
    out = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise UsageError(f"{flag}: expected FIELD=VALUE pairs separated by commas, got {part!r}")
        key, value = (x.strip() for x in part.split("=", 1))
        key = key.replace("-", "_")
        if key not in types:
            raise UsageError(f"{flag}: unknown field {key!r} (one of {', '.join(sorted(types))})")
        if key == "dp" and value in ("auto", "...", ""):
            continue
        try:
            out[key] = types[key](value)
        except ValueError:
            raise UsageError(f"{flag}: cannot read {key} from {value!r}") from None
    return out
