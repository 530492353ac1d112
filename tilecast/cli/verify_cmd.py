"""tilecast verify: tilecast's training step against transformers' GPT2LMHeadModel or LlamaForCausalLM."""

from __future__ import annotations

from tilecast.cli import UsageError
from tilecast.cli.common import add_json_arg, add_model_args, add_recompute_arg, model_args, print_json, recompute_arg


def add_parser(sub):
    p = sub.add_parser(
        "verify", help="check a tiled training step against transformers numerically",
        description="Build transformers' GPT2LMHeadModel (or LlamaForCausalLM, eager attention, for a Llama "
                    "model) with the same shape and weights, run two training "
                    "steps (same batches, AdamW, lr 1e-3) in both, and print the relative error "
                    "max|a-b|/max|b| of the first step's loss and logits, of every gradient of the first step and of "
                    "every parameter after the second update. Loss and gradients are compared in float32 "
                    "(tolerances 1e-5, 1e-4 and 1e-4). Parameters are compared in float64 by default (tolerance "
                    "1e-4): after AdamW, float32 rounding of gradients near zero moves parameters by amounts "
                    "that differ between any two float32 implementations, transformers' own attention "
                    "variants included; the float32 figures are printed too. Exit status 1 if any error "
                    "exceeds its tolerance.")
    add_model_args(p, model="gpt2-tiny", batch=2, seq=16, tile="8")
    add_recompute_arg(p)
    p.add_argument("--params-dtype", choices=("float64", "float32"), default="float64",
                   help="precision of the run whose parameters are checked (default: float64)")
    add_json_arg(p)
    return p


def run(args) -> int:
    import tilecast as tc
    from tilecast.cli.common import library_errors
    from tilecast.reference.verify import TOLERANCES, ReferenceUnavailable

    cfg, batch, seq, tiling = model_args(args)
    recompute = recompute_arg(args)
    try:
        with library_errors():
            out = tc.verify(cfg, batch, seq, tiling, params_dtype=args.params_dtype, recompute=recompute)
    except ReferenceUnavailable as e:  # torch or transformers missing: what to install
        raise UsageError(str(e)) from None
    res = out.result
    if args.json:
        print_json(res.to_dict())
        return 0 if res.ok else 1

    def mark(err, kind):
        return "ok" if err <= TOLERANCES[kind] else "FAIL"

    print(f"{cfg.name}, batch {batch} x {seq}, tiling {tiling}, recompute {recompute}")
    print("losses (tilecast / transformers): "
          + ", ".join(f"{a:.6f} / {b:.6f}" for a, b in zip(res.losses["tilecast"], res.losses["transformers"])))
    print(f"\n{'tensor':<44}{'gradient':>12}{'':>6}{'parameter':>12}{'':>6}")
    print(f"{'loss (' + res.dtypes['loss'] + ')':<44}{res.loss:>12.2e}{mark(res.loss, 'loss'):>6}")
    print(f"{'logits (' + res.dtypes['loss'] + ')':<44}{res.logits:>12.2e}{mark(res.logits, 'logits'):>6}")
    for name in res.grads:
        g, p = res.grads[name], res.params[name]
        print(f"{name:<44}{g:>12.2e}{mark(g, 'grads'):>6}{p:>12.2e}{mark(p, 'params'):>6}")
    print(f"\ngradients in {res.dtypes['grads']}, parameters in {res.dtypes['params']}; tolerances: "
          f"loss {TOLERANCES['loss']:g}, logits {TOLERANCES['logits']:g}, gradients {TOLERANCES['grads']:g}, parameters {TOLERANCES['params']:g}")
    if "float32_params" in res.extra:
        worst = max(res.extra["float32_params"].values())
        print(f"largest parameter error of the float32 run (for information): {worst:.2e}")
    print("verify: ok" if res.ok else f"verify: FAILED ({', '.join(res.failures[:5])})")
    return 0 if res.ok else 1
