"""tilecast accuracy: the fixed suite of configurations, predicted and measured on this machine."""

from __future__ import annotations

from tilecast.cli import UsageError
from tilecast.cli.common import add_json_arg, blas_summary, print_json, quiet_check_line
from tilecast.cli.starpu_errors import with_starpu_errors
from tilecast.loop.candidates import short_label


def add_parser(sub):
    from tilecast.loop.accuracy import LEARNING_PASSES, SUITES, TARGETS

    p = sub.add_parser(
        "accuracy", help="how well predicted step times match StarPU on this machine (a fixed suite)",
        description="Predict, then measure on StarPU, the step time of every configuration of a fixed suite "
                    "(full: 2 model shapes x 3 tilings x 2 schedulers); print each error, then the median and "
                    "maximum absolute error, Kendall's tau between the predicted and measured rankings, and how "
                    "much slower the predicted-best configuration measures than the measured best. Exit 1 when "
                    f"a target is missed (median <= {TARGETS['median_abs_error']:.0%}, max <= "
                    f"{TARGETS['max_abs_error']:.0%}, tau >= {TARGETS['kendall_tau']}, best gap <= "
                    f"{TARGETS['best_gap']:.0%}). The cores should be otherwise idle while it runs. Every StarPU "
                    "session runs between two reference steps (gpt2-tiny 32x128, tile 64, eager, every worker) and "
                    "is retaken when they ran over 12% slower than the fastest seen: some machines have spells "
                    "in which such steps run 20-30% slower, which say nothing about the models. On first use "
                    "(models that have not yet learned the suite's kernels from real runs) the suite runs twice: "
                    "a learning pass that refines the models from its traces, then the measured pass; the full "
                    "suite took 4.5-11.5 minutes a pass on 2 cores.")
    p.add_argument("--suite", default="full", choices=list(SUITES), help="which suite (default: full)")
    p.add_argument("--workers", type=int, default=None, metavar="N", help="CPU workers (default: every core)")
    p.add_argument("--steps", type=int, default=5, metavar="N", help="timed steps per configuration (default: 5)")
    p.add_argument("--warmup", type=int, default=2, metavar="N", help="warm-up steps before timing (default: 2)")
    p.add_argument("--recalibrate", action="store_true",
                   help="update the stored kernel models and host-cost fits from the measured runs and also show the "
                        "figures they "
                        "give on the same runs (in-sample; the next run of the suite measures them afresh)")
    p.add_argument("--learning-pass", choices=LEARNING_PASSES, default="auto",
                   help="run the suite once with --recalibrate before the measured pass: auto (default) when "
                        "fewer than 90%% of the suite's kernel shapes were learned from real runs, always, or "
                        "never (then a first run predicts from isolated kernel timings and the probes)")
    p.add_argument("--no-quiet-check", dest="quiet_check", action="store_false",
                   help="measure every session once, without the reference steps around it")
    p.add_argument("--max-wait", type=float, default=None, metavar="SECONDS",
                   help="the longest the quiet check may wait for slow spells to pass, in all (default: 240 for "
                        "the full suite, 5 for quick); "
                        "after that, sessions are kept whatever the reference says, and counted as disturbed")
    add_json_arg(p)
    return p


@with_starpu_errors("accuracy")
def run(args) -> int:
    from tilecast.loop.accuracy import run_suite

    if args.steps < 1:
        raise UsageError(f"--steps must be at least 1, got {args.steps}")
    if args.warmup < 0:
        raise UsageError(f"--warmup must be at least 0, got {args.warmup}")
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {args.workers}")
    if args.max_wait is not None and not 0 <= args.max_wait <= 3600:
        raise UsageError(f"--max-wait must be between 0 and 3600 seconds, got {args.max_wait}")
    blas_summary()  # warns before anything is measured when the BLAS runs a fallback core
    try:
        res = run_suite(args.suite, steps=args.steps, warmup=args.warmup, recalibrate=args.recalibrate,
                        workers=args.workers, quiet_check=args.quiet_check, max_wait_s=args.max_wait,
                        learning_pass=args.learning_pass)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.json:
        print_json(res.to_dict())
        return 0 if res.ok else 1
    print_table(res)
    return 0 if res.ok else 1


def print_table(res) -> None:
    c = res.conditions
    print(f"accuracy suite {c['suite']}: {len(res.rows)} configurations, median of {c['steps']} steps after "
          f"{c['warmup']} warm-up; load average {c['load_average_before']:.2f} before, "
          f"{c['load_average_after']:.2f} after, on {c['cpu_count']} cores")
    print(blas_summary()[1])
    if res.learning is not None:
        from tilecast.loop.accuracy import check_targets

        first = res.learning
        print("learning pass (the suite run once to teach the models; then predicted again and measured afresh):")
        _figures("  first predictions", first, first["targets_met"])
        _figures("  in-sample after learning", first["recalibrated"], check_targets(first["recalibrated"]))
        if first["conditions"].get("quiet"):
            print("  " + quiet_check_line(first["conditions"]["quiet"], first["rows"]))
        print("measured pass, with the refined models:")
    if c.get("quiet"):
        print(quiet_check_line(c["quiet"], res.rows))
    print()
    print(f"{'model':<12}{'batch':>7}{'tiling':>30}{'sched':>7}{'wk':>4}{'tasks':>7}{'pred ms':>10}{'real ms':>10}"
          f"{'error':>8}{'spread':>8}{'ref':>7}")
    for r in res.rows:
        ref = f"{r['reference_ratio_max']:>7.2f}" if "reference_ratio_max" in r else f"{'-':>7}"
        print(f"{r['model']:<12}{r['batch']:>3}x{r['seq']:<3}{_tile(r['tiling']):>30}{r['sched']:>7}"
              f"{r['workers']:>4}{r['tasks']:>7}{r['pred_step_s'] * 1e3:>10.2f}{r['real_step_s'] * 1e3:>10.2f}"
              f"{100 * r['error']:>7.1f}%{100 * r['real_spread']:>7.0f}%{ref}")
    if any("reference_ratio_max" in r for r in res.rows):
        print("(ref: the slowest reference step around the configuration's kept sessions, over the fastest seen)")
    print()
    _figures("figures", res.figures, res.targets_met)
    if res.after is not None:
        from tilecast.loop.accuracy import check_targets

        _figures("recalibrated from these runs (in-sample)", res.after, check_targets(res.after))
        print(f"models updated from the measured runs: {', '.join(res.calibration_files)}")


def _tile(desc: str) -> str:
    from tilecast.graph import Tiling

    return short_label(Tiling.parse(desc))


def _figures(title, f, met) -> None:
    tau = f["kendall_tau"]
    mark = lambda k: "ok" if met[k] else "MISSED"  # noqa: E731
    print(f"{title}: median |error| {100 * f['median_abs_error']:.1f}% ({mark('median_abs_error')}), "
          f"max {100 * f['max_abs_error']:.1f}% ({mark('max_abs_error')}), Kendall tau "
          f"{'n/a' if tau is None else f'{tau:.2f}'} ({mark('kendall_tau')}), predicted best "
          f"{100 * f['best_gap']:.1f}% from the measured best ({mark('best_gap')})")
