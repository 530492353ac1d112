"""tilecast accuracy: a fixed suite measured on StarPU and forecast three ways (first use, held out, repeatability)."""

from __future__ import annotations

from tilecast.cli.common import (add_json_arg, add_scheds_arg, add_steps_arg, add_worker_counts_arg, blas_summary,
                                 library_errors, parse_list, print_json, quiet_check_line)
from tilecast.cli.starpu_errors import with_starpu_errors
from tilecast.loop.candidates import short_label


def add_parser(sub):
    from tilecast.loop.accuracy import SUITES, TARGETS

    p = sub.add_parser(
        "accuracy", help="how well tilecast forecasts configurations that never ran (a fixed suite, on StarPU)",
        description="Measure on StarPU every configuration of a fixed suite (full: 4 model shapes the project "
                    "never tuned for, 3 GPT-2 and a Llama, x 4 or 2 tilings x 2 policies x 1 and all workers = 56 "
                    "configurations, every policy the simulator offers) and predict each three ways: first use (the models as "
                    "'tilecast calibrate' leaves them, nothing of the suite run: the headline), held out (refined "
                    "from the runs of the other model shapes) and repeatability (refined from these same runs, "
                    "in-sample). For each: the median and maximum absolute error of the step time, and per model "
                    "shape Kendall's tau between predicted and measured orders and how much slower the "
                    "predicted-best configuration measures than the measured best (tune's regret). Exit 1 when "
                    f"first use misses a target (median <= {TARGETS['median_abs_error']:.0%}, max <= "
                    f"{TARGETS['max_abs_error']:.0%}, tau >= {TARGETS['kendall_tau']}, best gap <= "
                    f"{TARGETS['best_gap']:.0%}). Calibrates what is missing first (once per machine). The cores "
                    "should be otherwise idle: every StarPU session runs between reference steps (gpt2-tiny 32x128, "
                    "tile 64, eager, not a suite configuration) and is retaken when they ran over 12% slower than "
                    "the fastest seen. Calibration runs under the same check, and its passes that the run's fastest "
                    "reference shows slow are timed again before first use is predicted.")
    p.add_argument("--suite", default="full", choices=list(SUITES), help="which suite (default: full; quick: 4 "
                   "configurations of two tiny shapes, to try the command)")
    add_worker_counts_arg(p, "1 and every core StarPU can use")
    add_scheds_arg(p, None, "every policy both simulated and offered by StarPU")
    add_steps_arg(p, 4, "per configuration, at least, after --warmup (short steps get more, over several "
                        "sessions; the others run in two sessions where there are at least 4)")
    p.add_argument("--warmup", type=int, default=1, metavar="N", help="warm-up steps per session (default: 1)")
    p.add_argument("--recalibrate", action="store_true",
                   help="also store the models learned from the measured runs, for later predictions (the suite's "
                        "first-use figure never uses them)")
    p.add_argument("--no-quiet-check", dest="quiet_check", action="store_false",
                   help="measure every session once, without the reference steps around it")
    p.add_argument("--max-wait", type=float, default=None, metavar="SECONDS",
                   help="the longest the quiet check may wait for slow spells to pass while measuring, in all "
                        "(default: 240 for the full suite, 5 for quick); "
                        "after that, sessions are kept whatever the reference says, and counted as disturbed")
    add_json_arg(p)
    return p


FLAGS = {"workers": "--worker-counts", "policies": "--scheds", "max_wait": "--max-wait"}


@with_starpu_errors("accuracy")
def run(args) -> int:
    import tilecast as tc

    workers = parse_list(args.worker_counts, "--worker-counts", int) if args.worker_counts else None
    policies = parse_list(args.scheds, "--scheds") if args.scheds else None
    blas_summary()  # warns before anything is measured when the BLAS runs a fallback core
    with library_errors(FLAGS):
        out = tc.accuracy(args.suite, steps=args.steps, warmup=args.warmup, recalibrate=args.recalibrate,
                          workers=workers, policies=policies, quiet_check=args.quiet_check,
                          max_wait_s=args.max_wait, progress=True)
    res = out.result
    if args.json:
        print_json(res.to_dict())
        return 0 if res.ok else 1
    print_table(res)
    return 0 if res.ok else 1


def print_table(res) -> None:
    from tilecast.loop.accuracy import VIEW_TITLES, VIEWS, check_targets

    c = res.conditions
    print(f"accuracy suite {c['suite']}: {len(res.rows)} configurations ({', '.join(c['policies'])}; workers "
          f"{', '.join(map(str, c['workers']))}), median of at least {c['steps']} steps after {c['warmup']} "
          f"warm-up; measured in {c['measure_s'] / 60:.1f} min (calibration {c['calibration_s'] / 60:.1f} min); "
          f"load average {c['load_average_before']:.2f} before, {c['load_average_after']:.2f} after, on "
          f"{c['cpu_count']} cores of {c['cpu']}")
    print(blas_summary()[1])
    if c.get("quiet"):
        print(quiet_check_line(c["quiet"], res.rows))
    if c.get("references"):
        print(references_line(c["references"]))
    if c.get("reference_note"):
        print(c["reference_note"])
    print()
    print(f"{'model':<11}{'batch':>7}{'tiling':>26}{'sched':>7}{'wk':>3}{'tasks':>6}{'real ms':>10}"
          f"{'first':>8}{'held':>8}{'repeat':>8}{'spread':>7}{'ref':>6}")
    for r in res.rows:
        ref = f"{r['reference_ratio_max']:>6.2f}" if "reference_ratio_max" in r else f"{'-':>6}"
        errs = "".join(f"{100 * r[f'error_{v}']:>7.1f}%" for v in VIEWS)
        print(f"{r['model']:<11}{r['batch']:>3}x{r['seq']:<3}{_tile(r['tiling']):>26}{r['sched']:>7}"
              f"{r['workers']:>3}{r['tasks']:>6}{r['real_step_s'] * 1e3:>10.1f}{errs}"
              f"{100 * r['real_spread']:>6.0f}%{ref}")
    print("(errors: predicted step vs measured median; ref: the slowest reference step around the kept sessions, "
          "over the fastest seen)")
    print()
    for v in VIEWS:
        f = res.figures[v]
        _figures(VIEW_TITLES[v], f, check_targets(f), marks=v != "repeatability")
        shapes = "; ".join(f"{name} tau {_tau(s['kendall_tau'])}, best gap {100 * s['best_gap']:.1f}%"
                           for name, s in f["per_shape"].items())
        print(f"  per shape: {shapes}; median bias {100 * f['bias']:+.1f}%")
    if res.calibration_files:
        print(f"models updated from the measured runs: {', '.join(res.calibration_files)}")


def references_line(r: dict) -> str:
    """The reference step while calibration timed and while the suite was measured, side by side."""
    def ms(v):
        return "-" if v is None else f"{v * 1e3:.1f} ms"

    line = (f"reference step, median (fastest): calibration {ms(r['calibration_s'])} ({ms(r['calibration_best_s'])})"
            f"{'' if r['calibration_timed_in_this_run'] else ' (stored)'}, measurement {ms(r['measurement_s'])} "
            f"({ms(r['measurement_best_s'])})")
    p = r.get("calibration_passes")
    if p:
        line += (f"; by the run's fastest, {p['disturbed']} of {p['passes']} calibration passes disturbed, "
                 f"{p['retaken']} retaken at the end")
    return line


def _tile(desc: str) -> str:
    from tilecast.graph import Tiling

    return short_label(Tiling.parse(desc))


def _tau(tau) -> str:
    return "n/a" if tau is None else f"{tau:.2f}"


def _figures(title, f, met, marks: bool = True) -> None:
    mark = (lambda k: " (ok)" if met[k] else " (MISSED)") if marks else (lambda k: "")  # noqa: E731
    print(f"{title}: median |error| {100 * f['median_abs_error']:.1f}%{mark('median_abs_error')}, "
          f"max {100 * f['max_abs_error']:.1f}%{mark('max_abs_error')}, Kendall tau (lowest shape) "
          f"{_tau(f['kendall_tau'])}{mark('kendall_tau')}, predicted best {100 * f['best_gap']:.1f}% from the "
          f"measured best (largest shape){mark('best_gap')}")
