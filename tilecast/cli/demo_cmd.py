"""tilecast demo: calibrate, tune a small GPT, run the top choices on StarPU, compare, write the report."""

from __future__ import annotations

from tilecast.cli import UsageError
from tilecast.cli.common import add_json_arg, as_flags, print_json
from tilecast.cli.starpu_errors import with_starpu_errors
from tilecast.loop.candidates import short_label

DEFAULT_OUT = "tilecast-demo"


def add_parser(sub):
    p = sub.add_parser(
        "demo", help="calibrate this computer, tune a small GPT, run the best on StarPU, write a report",
        description="The whole loop on this computer: calibrate the kernels and StarPU's per-step cost (first "
                    "run only; cached), rank tilings, schedulers and worker counts of a small GPT step by "
                    "simulation, run the best two and one from the rest of the ranking on StarPU, compare "
                    "prediction and measurement, and write the report folder (HTML page, Gantt chart, errors "
                    "by kernel, Chrome traces, ranking).")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"report folder (default: {DEFAULT_OUT})")
    p.add_argument("--model", default=None, metavar="NAME|FILE.json|JSON",
                   help="model to tune (default: a 2-layer, 256-wide GPT with a 2048-token vocabulary)")
    p.add_argument("--batch", type=int, default=None, metavar="N", help="sequences per step (default: 4)")
    p.add_argument("--seq", type=int, default=None, metavar="N", help="tokens per sequence (default: 128)")
    p.add_argument("--top", type=int, default=2, metavar="K", help="best configurations to run (default: 2)")
    p.add_argument("--steps", type=int, default=3, metavar="N", help="timed steps per run (default: 3)")
    add_json_arg(p)
    return p


@with_starpu_errors("demo")
def run(args) -> int:
    from tilecast.graph.model_config import ModelConfigError, load_model
    from tilecast.loop.demo import DEMO_BATCH, DEMO_SEQ, run_demo

    cfg = None
    if args.model:
        try:
            cfg = load_model(args.model).check_tiled()
        except ModelConfigError as e:
            raise UsageError(as_flags(str(e))) from None
    batch = args.batch or DEMO_BATCH
    seq = args.seq or DEMO_SEQ
    for flag, v in (("--batch", batch), ("--seq", seq), ("--top", args.top), ("--steps", args.steps)):
        if v < 1:
            raise UsageError(f"{flag} must be at least 1, got {v}")
    if cfg is not None and seq > cfg.n_positions:
        raise UsageError(f"--seq {seq} exceeds the model's n_positions ({cfg.n_positions})")
    res = run_demo(args.out, cfg, batch, seq, top=args.top, steps=args.steps)
    s = res.summary()
    if args.json:
        print_json(s)
        return 0
    best = res.execution.checked[0]
    c = best.prediction.config
    print(f"tuned {c.model.name}, batch {c.batch} x {c.seq}: {s['configurations']} configurations simulated, "
          f"{len(s['executed'])} run on StarPU ({s['seconds']:.0f} s in all)")
    print(f"best predicted: tiling {short_label(c.tiling)}, {c.sched}, {c.workers} workers: step time "
          f"predicted {best.prediction.step_s * 1e3:.1f} ms, measured {best.measurement.median_s * 1e3:.1f} ms "
          f"({100 * best.error:+.1f}%), {c.tokens / best.measurement.median_s:.0f} tokens/s")
    print()
    from tilecast.cli.tables import print_executed

    print_executed(res.execution)
    print()
    print(f"report: {s['report']}")
    print(f"folder: {s['folder']} (ranking.csv, executed.json, Gantt chart, errors by kernel, Chrome traces)")
    return 0
