"""``tc.verify``, ``tc.accuracy`` and ``tc.demo``: the checks of tilecast against references and measurements
(``tilecast verify``, ``tilecast accuracy``, ``tilecast demo``), each a result with ``to_frame()``.

Bad input raises :class:`tilecast.errors.FieldError` (or ``ModelConfigError``, ``TilingError``) whose message
starts with the argument at fault; a missing reference (torch, transformers) or StarPU raises its own error."""

from __future__ import annotations

from dataclasses import dataclass, field

from tilecast.api.base import _at_least, _config, _Result, _shape, _tiling
from tilecast.errors import FieldError

# float32 weights, gradients, two AdamW moments, and the reference's copies, in float64 for the parameters:
# a model past this many bytes (16 per parameter, 6 copies) is too large for a numpy reference check
VERIFY_MAX_BYTES = 8e9


# --- verify ------------------------------------------------------------------------------------------------
@dataclass
class VerifyResult(_Result):
    """A tiled training step against transformers' (``tilecast verify``): relative errors max|a-b|/max|b| of the
    loss, logits, every gradient and every parameter after the second update; ``to_frame()`` has one row per
    tensor (gradient and parameter errors); ``summary`` is ``tilecast verify --json``."""

    model: str
    ok: bool
    loss: float
    logits: float
    failures: list
    summary: dict = field(repr=False, default_factory=dict)
    result: object = field(repr=False, default=None)  # tilecast.reference.verify.VerifyResult

    def to_frame(self):
        import pandas as pd

        r = self.result
        return pd.DataFrame([{"tensor": n, "gradient_error": r.grads[n], "parameter_error": r.params.get(n)}
                             for n in r.grads])

    def _headline(self) -> str:
        return f"{self.model}: {'ok' if self.ok else 'FAILED'} (loss error {self.loss:.2e})"


def verify(model="gpt2-tiny", batch: int = 2, seq: int = 16, tile="8", params_dtype: str = "float64",
           recompute: str = "none") -> VerifyResult:
    """Two training steps of ``model`` in tilecast's tiles and in transformers (GPT2LMHeadModel or
    LlamaForCausalLM, eager attention), same weights and batches, AdamW lr 1e-3 (``tilecast verify``);
    ``params_dtype``: float64 or float32, the precision of the run whose parameters are compared."""
    from tilecast.reference.verify import verify as verify_step

    cfg, tiling = _config(model), _tiling(tile)
    _shape(cfg, batch, seq)
    if params_dtype not in ("float64", "float32"):
        raise FieldError(f"params_dtype: must be float64 or float32, got {params_dtype!r}")
    if cfg.n_params() * 16 * 6 > VERIFY_MAX_BYTES:
        raise FieldError(f"model: {cfg.name} is too large for a numpy reference check; use a small shape")
    r = verify_step(cfg, batch, seq, tiling, params_dtype=params_dtype, recompute=recompute)
    return VerifyResult(cfg.name, r.ok, r.loss, r.logits, list(r.failures), r.to_dict(), r)


# --- accuracy ----------------------------------------------------------------------------------------------
@dataclass
class AccuracyResult(_Result):
    """A fixed suite measured on StarPU and forecast three ways (``tilecast accuracy``): ``figures`` per view
    (first_use, held_out, repeatability: median and max |error|, Kendall's tau, best gap); ``ok``: first use
    met every target; ``to_frame()`` has one row per configuration (measured and the three errors);
    ``summary`` is ``tilecast accuracy --json``."""

    suite: str
    ok: bool
    figures: dict
    conditions: dict
    summary: dict = field(repr=False, default_factory=dict)
    result: object = field(repr=False, default=None)  # tilecast.loop.accuracy.SuiteResult

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.result.rows)

    def _headline(self) -> str:
        f = self.figures["first_use"]
        return (f"suite {self.suite}: first use median |error| {100 * f['median_abs_error']:.1f}%, "
                f"{'targets met' if self.ok else 'targets MISSED'}")


def accuracy(suite: str = "full", steps: int = 4, warmup: int = 1, recalibrate: bool = False, workers=None,
             policies=None, quiet_check: bool = True, max_wait_s: float | None = None,
             progress: bool = False) -> AccuracyResult:
    """Measure every configuration of ``suite`` (``full`` or ``quick``) on StarPU and predict each first-use,
    held-out and in-sample (``tilecast accuracy``; calibrates what is missing first). ``workers``: worker
    counts to take in turn; ``policies``: scheduling policies (default: every one both simulated and offered
    by StarPU); ``quiet_check``: retake sessions run in a slow spell, waiting at most ``max_wait_s`` in all."""
    from tilecast.loop.accuracy import SUITES, run_suite
    from tilecast.loop.accuracy_suite import suite_configs, suite_policies

    if suite not in SUITES:
        raise FieldError(f"suite: must be one of {', '.join(SUITES)}, got {suite!r}")
    _at_least("steps", steps, 1)
    _at_least("warmup", warmup, 0)
    if max_wait_s is not None and not 0 <= max_wait_s <= 3600:
        raise FieldError(f"max_wait must be between 0 and 3600 seconds, got {max_wait_s}")
    workers = [workers] if isinstance(workers, int) else None if workers is None else list(workers)
    policies = [policies] if isinstance(policies, str) else None if policies is None else list(policies)
    if policies is not None:
        offered = suite_policies()
        bad = [s for s in policies if s not in offered]
        if bad:
            raise FieldError(f"policies: {', '.join(bad)} not both simulated and offered by StarPU here "
                             f"(known: {', '.join(offered)})")
    suite_configs(suite, workers, policies)  # told before anything is calibrated or measured
    res = run_suite(suite, steps=steps, warmup=warmup, recalibrate=recalibrate, workers=workers,
                    quiet_check=quiet_check, max_wait_s=max_wait_s, policies=policies, progress=progress)
    return AccuracyResult(suite, res.ok, res.figures, res.conditions, res.to_dict(), res)


# --- demo --------------------------------------------------------------------------------------------------
@dataclass
class DemoResult(_Result):
    """The whole loop on this computer (``tilecast demo``): configurations ranked by simulation, the best run
    on StarPU beside their predictions, the report folder; ``to_frame()`` has one row per configuration run;
    ``summary`` is ``tilecast demo --json``."""

    folder: str
    report: str | None
    configurations: int
    median_abs_error: float
    max_abs_error: float
    seconds: float
    summary: dict = field(repr=False, default_factory=dict)
    result: object = field(repr=False, default=None)  # tilecast.loop.demo.DemoResult

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.summary["executed"])

    def _headline(self) -> str:
        return (f"{self.configurations} configurations, {len(self.summary['executed'])} run: median |error| "
                f"{100 * self.median_abs_error:.1f}%; report {self.report}")


def demo(folder: str = "tilecast-demo", model=None, batch: int | None = None, seq: int | None = None,
         execute: int = 2, steps: int = 3, progress: bool = False) -> DemoResult:
    """Calibrate this computer (first use), rank tilings, schedulers and worker counts of a small GPT step
    (``model`` default: a 2-layer, 256-wide GPT) by simulation, run the ``execute`` best and one other on
    StarPU (``steps`` timed after 2 warm-up steps), compare, and write the report into ``folder``."""
    from tilecast.loop.demo import DEMO_BATCH, DEMO_SEQ, default_model, run_demo

    cfg = _config(model) if model is not None else default_model()
    batch, seq = batch or DEMO_BATCH, seq or DEMO_SEQ
    _shape(cfg, batch, seq)
    _at_least("execute", execute, 1)
    _at_least("steps", steps, 1)
    res = run_demo(folder, cfg, batch, seq, top=execute, steps=steps, progress=progress)
    s = res.summary()
    return DemoResult(s["folder"], s["report"], s["configurations"], s["median_abs_error"], s["max_abs_error"],
                      s["seconds"], s, res)
