"""tilecast demo: calibrate, tune a small GPT, run the top choices on StarPU, compare, write the report."""

from __future__ import annotations

from tilecast.cli.common import (add_json_arg, add_model_args, add_out_arg, add_steps_arg, blas_summary, check_model,
                                 print_json)
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
    from tilecast.loop.demo import DEMO_BATCH, DEMO_SEQ

    add_out_arg(p, DEFAULT_OUT, "the report (HTML page, Gantt chart, errors by kernel, Chrome traces, ranking)")
    add_model_args(p, model=None, batch=DEMO_BATCH, seq=DEMO_SEQ, tile_flag=False,
                   model_default="a 2-layer, 256-wide GPT with a 2048-token vocabulary")
    p.add_argument("--execute", type=int, default=2, metavar="K",
                   help="run the K best configurations on StarPU, and one from the rest of the ranking (default: 2)")
    add_steps_arg(p, 3, "per run, after 2 warm-up steps")
    add_json_arg(p)
    return p


@with_starpu_errors("demo")
def run(args) -> int:
    import tilecast as tc
    from tilecast.cli.common import library_errors
    from tilecast.loop.demo import default_model

    cfg = check_model(args.model if args.model is not None else default_model(), args.batch, args.seq)
    with library_errors():
        out = tc.demo(args.out, cfg, args.batch, args.seq, execute=args.execute, steps=args.steps, progress=True)
    res, s = out.result, out.summary
    blas, blas_line = blas_summary()
    if args.json:
        print_json({**s, "blas": blas})
        return 0
    best = res.execution.checked[0]
    c = best.prediction.config
    print(f"tuned {c.model.name}, batch {c.batch} x {c.seq}: {s['configurations']} configurations simulated, "
          f"{len(s['executed'])} run on StarPU ({s['seconds']:.0f} s in all)")
    print(f"best predicted: tiling {short_label(c.tiling)}, {c.sched}, {c.workers} workers: step time "
          f"predicted {best.prediction.step_s * 1e3:.1f} ms, measured {best.measurement.median_s * 1e3:.1f} ms "
          f"({100 * best.error:+.1f}%), {c.tokens / best.measurement.median_s:.0f} tokens/s")
    print(blas_line)
    print()
    from tilecast.cli.tables import print_executed

    print_executed(res.execution)
    print()
    print(f"report: {s['report']}")
    print(f"folder: {s['folder']} (ranking.csv, executed.json, Gantt chart, errors by kernel, Chrome traces)")
    return 0
