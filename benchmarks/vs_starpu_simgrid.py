"""tilecast's simulator side by side with StarPU's own (SimGrid mode), both against measured steps.

Opt-in (not part of CI): the first run builds StarPU 1.3.10 with SimGrid from
Debian's source package into ``$TILECAST_HOME/starpu-simgrid``
(``tilecast.executor.simgrid_build``; ``--source`` or ``$TILECAST_STARPU_SRC``
names the unpacked ``apt-get source starpu``; needs ``libsimgrid-dev``).

Protocol, per configuration (a model, batch x seq, tiling, scheduler, all
workers), as the accuracy suite's:

1. learning pass: every configuration runs on StarPU (Debian's, as tilecast
   always runs it), and tilecast's models learn from the traces (kernel
   durations in the runtime, host cost, cost per task) and are stored.
   ``STARPU_CALIBRATE=1`` is set for the whole benchmark, so that StarPU's
   history files record every task under every policy (StarPU records only
   what a model-based policy asked about otherwise, so eager's tasks would
   be missing); it applies to every measured step alike. So does
   ``STARPU_HISTORY_MAX_ERROR`` (:data:`HISTORY_MAX_ERROR`): by default StarPU
   flushes a footprint's samples whenever as many deviate by more than 50%
   from their mean as agree with it, which the memory-bound tasks of a busy
   2-core machine do (seen: the tile-128 step's ``embed`` footprint left with
   no sample), and SimGrid cannot simulate a task with no sample.
2. both simulators predict every configuration from what that pass left:
   tilecast with its stored models (:func:`tilecast.loop.predict.predict`),
   StarPU-with-SimGrid from the same ``STARPU_HOME`` history files and bus
   calibration (platform) under the same host name
   (:func:`tilecast.executor.simgrid_replay.simgrid_makespans`). Each
   simulator's wall time is timed per configuration (below): tilecast's whole
   ``predict`` (dependencies, duration model, simulation, summary);
   SimGrid's replay process (StarPU's start, simulation, shutdown). Building
   the graph is left out of both.
3. every configuration is measured afresh (median step and makespan).

SimGrid gives a makespan; its step time is that makespan plus the same host
cost per step tilecast adds to its own (the fitted time outside the task
graph). Errors are relative to the measured median step; makespan errors
(against the median measured makespan) are printed and in the JSON too.

Timing (both simulators alike): each configuration is predicted ``--repeats``
times by each simulator, taking turns, and each simulator's median is kept.
tilecast predicts in this process, where it is imported and its stored models
are loaded once (as ``tune`` predicts its candidates), each time on a fresh
copy of the graph (the task list alone: dependencies, flops and footprints
are inferred again, as StarPU infers them from the submitted tasks). SimGrid
runs its replay process, StarPU's start (reading its history files and
platform) and shutdown included: the only way it simulates a graph; the
export of the graph for it and its priorities are prepared outside its timer.
Where StarPU's start dominates, the JSON's ``simgrid_step_wall_s`` (the time
one more simulated step adds to a replay process, from ``1 + --repeats``
steps in one process) shows SimGrid's simulation alone.
The one-time costs that the per-prediction times leave out are printed too:
importing tilecast's prediction path and loading its models in a fresh
process (``tilecast_startup_s``), and the first prediction, which also fits
the kernels' shape models on the calibration (``tilecast_first_predict_s``;
they are kept for later predictions with the same calibration).
``fresh_process_speedup`` compares what each simulator needs to predict every
configuration from nothing but the stored files: SimGrid's processes against
one fresh tilecast process (``tilecast_fresh_process_s``: its start, its
first prediction, then the other configurations' per-prediction times).

Every run that measures stores what the comparison needs under
``$TILECAST_HOME/vs_starpu_simgrid/<suite>/``: StarPU's histories as the
learning pass left them (before the measured steps add their own samples) and
the measured steps (``measured.pkl``: per configuration its Measurement, traces
included). ``--reuse`` predicts again from them without running StarPU: both
simulators from the same learning pass (tilecast's models as stored under
``$TILECAST_HOME``, SimGrid from the stored histories) against the same
measured steps, so that a change to tilecast's model is compared before/after
on the same figures. The learning pass's measurements are stored too
(``learned.pkl``): ``--reuse --relearn central|median`` learns tilecast's
kernel models again from them (in memory), by the current rule or by the one
before it, so that both rules are compared on the same learning pass.

``--wall-only`` skips the learning pass and the measurements: both simulators
are timed on the models and histories already stored (tilecast's under
``$TILECAST_HOME``, StarPU's under ``--starpu-home``); errors are not computed.
``--simgrid-home DIR`` uses the StarPU-with-SimGrid and replay program that
another tilecast home has built (read only; nothing is built or written
there) and, unless ``--starpu-home`` says otherwise, that home's StarPU
histories.

Prints the conditions (CPU, BLAS), a table, and as its last line one JSON
object: tilecast_median_abs_error, simgrid_median_abs_error,
tilecast_max_abs_error, simgrid_max_abs_error, speedup (SimGrid wall time /
tilecast's, summed over configurations), targets_met, rows, conditions.
Targets: tilecast at least as accurate on both figures, at least 10x faster.

    python3 benchmarks/vs_starpu_simgrid.py [--suite quick|default] [--source DIR] [--steps 5] [--repeats 3]
    python3 benchmarks/vs_starpu_simgrid.py --reuse [--relearn central|median] [--suite quick|default]
    python3 benchmarks/vs_starpu_simgrid.py --wall-only [--simgrid-home DIR] [--starpu-home DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

TARGET_SPEEDUP = 10.0
HISTORY_MAX_ERROR = 1_000_000  # percent: StarPU never flushes a footprint's history (its default: 50)

SMALL = {"name": "gpt2-4x512", "n_layer": 4, "n_embd": 512, "n_head": 8, "vocab_size": 8192, "n_positions": 512}
SUITES = {
    # (model, batch, seq, tilings, schedulers): a subset of the accuracy suite's
    "default": [
        ("gpt2-tiny", 32, 128, ("64", "128"), ("eager", "dmda")),
        (SMALL, 16, 256, ("256",), ("eager", "dmda")),
    ],
    "quick": [
        ("gpt2-tiny", 32, 128, ("64", "128"), ("eager", "dmda")),
    ],
}


def configs(suite: str, workers: int) -> list:
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import from_dict, load_model
    from tilecast.loop.config import StepConfig

    out = []
    for model, batch, seq, tiles, scheds in SUITES[suite]:
        cfg = from_dict(model, name=model["name"]) if isinstance(model, dict) else load_model(model)
        out += [StepConfig(cfg, batch, seq, Tiling.parse(t), s, workers) for t in tiles for s in scheds]
    return out


def err(pred: float, real: float) -> float:
    return (pred - real) / real


def replay_in(simgrid_home: Path) -> Path:
    """The replay program another tilecast home has built against its StarPU-with-SimGrid (read only)."""
    from tilecast.executor import simgrid_build as sb

    prefix = Path(simgrid_home) / "starpu-simgrid"
    stamp = prefix / sb.STAMP
    if not stamp.is_file() or stamp.read_text() != sb._stamp_text():
        sys.exit(f"vs_starpu_simgrid: --simgrid-home: no finished StarPU {sb.STARPU_VERSION} SimGrid build in {prefix}")
    flags = sb.pkg_config_flags(prefix)
    key = hashlib.sha256((sb.C_DIR / "simgrid_replay.c").read_bytes() + sb._stamp_text().encode()
                         + " ".join(flags).encode()).hexdigest()[:16]  # as simgrid_build.ensure_replay names it
    exe = prefix / "bin" / f"tilecast-simgrid-replay-{key}"
    if not exe.is_file():
        sys.exit(f"vs_starpu_simgrid: --simgrid-home: {exe} is missing (the replay program of this source is "
                 f"built there by a run of this benchmark with TILECAST_HOME={simgrid_home})")
    return exe


def reuse_dir(suite: str) -> Path:
    """Where a run stores the learning pass's StarPU histories and the measured steps for ``--reuse``."""
    from tilecast.home import home

    return home("vs_starpu_simgrid", suite)


def keep_histories(starpu_dir: Path, dest: Path) -> Path:
    """A copy of ``starpu_dir``'s samples (histories, bus calibration) as a STARPU_HOME of its own."""
    import shutil

    target = dest / "starpu"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(Path(starpu_dir) / ".starpu" / "sampling", target / ".starpu" / "sampling")
    return target


MEASURED, LEARNED = "measured.pkl", "learned.pkl"  # the measured steps; the learning pass's (the models' input)


def save_measured(dest: Path, cfgs, measurements, name: str = MEASURED) -> Path:
    """Store ``measurements`` (one per configuration, traces included) as ``dest/name``."""
    import pickle

    path = dest / name
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        pickle.dump({c.label(): m for c, m in zip(cfgs, measurements)}, f)
    tmp.replace(path)
    return path


def load_measured(dest: Path, cfgs, name: str = MEASURED) -> list:
    import pickle

    path = dest / name
    if not path.is_file() or not (dest / "starpu").is_dir():
        sys.exit(f"vs_starpu_simgrid: --reuse: no {name} in {dest} (run this benchmark once without --reuse, "
                 f"same --suite)")
    with open(path, "rb") as f:
        stored = pickle.load(f)
    missing = [c.label() for c in cfgs if c.label() not in stored]
    if missing:
        sys.exit(f"vs_starpu_simgrid: --reuse: {path} has no measurement of {', '.join(missing)}")
    return [stored[c.label()] for c in cfgs]


def relearn(cfgs, learned, machine, cal, how: str):
    """The kernel calibration learned again from the learning pass's stored measurements (``how``: "central",
    the current rule; "median", each shape's median over the steps of its per-step mean, the rule before)."""
    from tilecast.loop.execute import learning_groups
    from tilecast.perfmodel.from_trace import calibration_from_trace

    for graph, traces, workers in learning_groups(cfgs, learned):
        cal = calibration_from_trace(graph, traces, machine, base=cal, workers=workers, central=how == "central")
    return cal


def fresh(graph):
    """The same task list without the figures a graph caches once computed (dependencies, flops, ...)."""
    return dataclasses.replace(graph)


def startup_seconds() -> float:
    """Wall time of importing tilecast's prediction path and loading its stored models in a fresh process."""
    code = ("import time; t0 = time.perf_counter()\n"
            "from tilecast.loop.predict import predict, stored_models\n"
            "from tilecast.simulator.simulate import simulate\n"
            "from tilecast.simulator.native import library\n"
            "from tilecast.perfmodel import load_machine\n"
            "from tilecast.perfmodel.kernel_model import DurationModel\n"
            "library(); stored_models(load_machine('local'))\n"
            "print(time.perf_counter() - t0)")
    res = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    return float(res.stdout.split()[-1]) if res.returncode == 0 and res.stdout.split() else float("nan")


def time_both(cfgs, graphs, machine, cal, host, starpu_dir, exe, repeats: int):
    """Predict every configuration with both simulators ``repeats`` times in turn: (tilecast's predictions,
    SimGrid's runs, tilecast's median wall s, SimGrid's median wall s, SimGrid's wall s per extra step)."""
    from tilecast.executor.simgrid_replay import simgrid_makespans
    from tilecast.loop.predict import predict

    preds, runs, tc_wall, sg_wall, sg_step = [], [], [], [], []
    for c in cfgs:
        g = graphs[c.graph_key]
        tw, sw = [], []
        for _ in range(repeats):
            copy = fresh(g)
            t0 = time.perf_counter()
            p = predict(c, machine, cal, host, graph=copy)
            tw.append(time.perf_counter() - t0)
            run = simgrid_makespans(g, c.sched, c.workers, starpu_dir, exe=exe)
            sw.append(run.wall_s)
        if run.workers != c.workers:
            raise RuntimeError(f"SimGrid simulated {run.workers} workers, not {c.workers}: the platform file "
                               f"describes fewer CPUs")
        many = simgrid_makespans(g, c.sched, c.workers, starpu_dir, steps=1 + repeats, exe=exe)
        preds.append(p)
        runs.append(run)
        tc_wall.append(float(np.median(tw)))
        sg_wall.append(float(np.median(sw)))
        sg_step.append(max(many.wall_s - sg_wall[-1], 0.0) / repeats)
    return preds, runs, tc_wall, sg_wall, sg_step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", choices=sorted(SUITES), default="default")
    ap.add_argument("--source", help="StarPU 1.3.10 source tree (default: $TILECAST_STARPU_SRC)")
    ap.add_argument("--workers", type=int, default=None, help="CPU workers (default: all cores, StarPU's limit)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3,
                    help="timed predictions per configuration and simulator, taking turns; medians (default 3)")
    ap.add_argument("--no-learning-pass", action="store_true",
                    help="predict from the models and histories as they are (e.g. after an earlier run)")
    ap.add_argument("--reuse", action="store_true",
                    help="predict again from the learning pass and measured steps a run of this suite stored "
                         "(no StarPU run)")
    ap.add_argument("--relearn", choices=("central", "median"),
                    help="with --reuse: learn tilecast's kernel models again from the stored learning pass (not "
                         "saved): per shape, the mean over the central steps (as now) or the median over the "
                         "steps of each step's mean (as before 2026-12-01)")
    ap.add_argument("--wall-only", action="store_true",
                    help="time both simulators on the stored models and histories only: no learning pass, no "
                         "measured steps, no errors")
    ap.add_argument("--simgrid-home", metavar="DIR",
                    help="use the StarPU-with-SimGrid and replay program built under another tilecast home (read "
                         "only), and its StarPU histories unless --starpu-home is given")
    ap.add_argument("--starpu-home", metavar="DIR",
                    help="STARPU_HOME whose histories and platform SimGrid reads (default: $TILECAST_HOME/starpu)")
    ap.add_argument("--max-wait", type=float, default=60.0,
                    help="seconds the quiet check may wait for slow spells of the machine, in all (0: no check)")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats: at least 1, got {args.repeats}")
    if args.relearn and not args.reuse:
        ap.error("--relearn: only with --reuse")
    if args.reuse and (args.wall_only or args.no_learning_pass or args.starpu_home):
        ap.error("--reuse: predicts from what a run stored; not with --wall-only, --no-learning-pass or --starpu-home")

    # before any StarPU session starts: histories of every task, every sample kept (see the docstring)
    os.environ["STARPU_CALIBRATE"] = "1"
    os.environ["STARPU_HISTORY_MAX_ERROR"] = str(HISTORY_MAX_ERROR)
    from tilecast.executor.simgrid_build import ensure_replay
    from tilecast.executor.simgrid_replay import starpu_hostname
    from tilecast.executor.starpu_session import default_workers, starpu_home
    from tilecast.loop.predict import predict, stored_models
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.local import conditions_line, run_conditions
    from tilecast.reports import ranking_accuracy

    conditions = run_conditions()
    print(conditions_line(conditions))
    # builds StarPU with SimGrid on first use (minutes), unless another home's build is named
    exe = replay_in(Path(args.simgrid_home)) if args.simgrid_home else ensure_replay(args.source)
    starpu_dir = Path(args.starpu_home or (Path(args.simgrid_home) / "starpu" if args.simgrid_home else starpu_home()))
    workers = args.workers or default_workers()
    cfgs = configs(args.suite, workers)
    machine = load_machine("local")
    graphs = {}
    for c in cfgs:
        if c.graph_key not in graphs:
            graphs[c.graph_key] = c.build()
    load_before = os.getloadavg()

    store = reuse_dir(args.suite)
    if args.reuse:
        measured = load_measured(store, cfgs)
        starpu_dir = store / "starpu"
    if args.wall_only or args.reuse:
        cal, host = stored_models(machine)
        if cal is None:
            sys.exit("vs_starpu_simgrid: --wall-only/--reuse: no stored calibration for this machine under "
                     "$TILECAST_HOME (run `tilecast calibrate`, or this benchmark once without them)")
        if args.relearn:
            cal = relearn(cfgs, load_measured(store, cfgs, LEARNED), machine, cal, args.relearn)
    else:
        from tilecast.loop.execute import execute
        from tilecast.loop.host_cost import ensure_host_costs
        from tilecast.loop.interference import QuietGuard
        from tilecast.loop.kernel_calibration import ensure_calibration

        def guard():
            return QuietGuard(workers=workers, max_wait_s=args.max_wait) if args.max_wait > 0 else None

        def models():
            host = ensure_host_costs(machine, [workers], scheds=sorted({c.sched for c in cfgs}))
            cal = ensure_calibration(machine, graphs.values())
            return cal, host

        cal, host = models()
        if not args.no_learning_pass:
            print("learning pass: every configuration runs once; tilecast's models and StarPU's histories learn "
                  "from it", file=sys.stderr)
            preds = [predict(c, machine, cal, host, graph=graphs[c.graph_key]) for c in cfgs]
            learning = execute(preds, preds, machine, cal, host, steps=args.steps, warmup=args.warmup,
                               recalibrate=True, guard=guard())
            learning.save_models(machine)
            cal, host = models()
        store.mkdir(parents=True, exist_ok=True)
        keep_histories(starpu_dir, store)  # SimGrid's inputs as the learning pass left them
        if not args.no_learning_pass:
            save_measured(store, cfgs, learning.learned, LEARNED)

    print("predicting: tilecast and StarPU in SimGrid mode in turn", file=sys.stderr)
    # first use: lazy imports, and the kernels' shape models fitted on the calibration (then kept for it)
    t0 = time.perf_counter()
    predict(cfgs[0], machine, cal, host, graph=fresh(graphs[cfgs[0].graph_key]))
    first = time.perf_counter() - t0
    preds, runs, tc_wall, sg_wall, sg_step = time_both(cfgs, graphs, machine, cal, host, starpu_dir, exe,
                                                       args.repeats)
    sg = [r.makespan_s for r in runs]
    warnings = sum("not calibrated enough" in w for r in runs for w in r.warnings)
    startup = startup_seconds()
    load_after = os.getloadavg()
    speedup = sum(sg_wall) / sum(tc_wall)
    # every configuration from nothing but the stored files, as SimGrid predicts each: one fresh tilecast process
    # (imports, models, the first prediction with its fits, then the others) against SimGrid's processes
    fresh_s = startup + first + sum(tc_wall[1:])
    timing = {"speedup": speedup, "tilecast_wall_s": sum(tc_wall), "simgrid_wall_s": sum(sg_wall),
              "simgrid_step_wall_s": sum(sg_step), "simgrid_step_speedup": sum(sg_step) / sum(tc_wall),
              "tilecast_startup_s": startup, "tilecast_first_predict_s": first,
              "tilecast_fresh_process_s": fresh_s, "fresh_process_speedup": sum(sg_wall) / fresh_s,
              "repeats": args.repeats, "load_average": [load_before[0], load_after[0]]}
    timing_line = (f"wall time per prediction (medians of {args.repeats}): tilecast {sum(tc_wall):.4f} s, SimGrid "
                   f"{sum(sg_wall):.3f} s: {speedup:.1f}x (target >= {TARGET_SPEEDUP:.0f}x); SimGrid's extra step "
                   f"alone {sum(sg_step):.3f} s ({timing['simgrid_step_speedup']:.1f}x); tilecast's one-time start "
                   f"(imports, models) {startup:.2f} s, its first prediction (fits) {first:.3f} s; all from a fresh process "
                   f"{fresh_s:.2f} s ({timing['fresh_process_speedup']:.1f}x); load average {load_before[0]:.1f} before, "
                   f"{load_after[0]:.1f} after (2 cores)")

    if args.wall_only:
        print(f"{'configuration':<44}{'tasks':>6}{'tilecast':>10}{'SimGrid':>10}{'tc wall':>9}{'sg wall':>9}"
              f"{'sg step':>9}")
        rows = []
        for c, p, s, tw, sw, ss in zip(cfgs, preds, sg, tc_wall, sg_wall, sg_step):
            rows.append({"config": p.config.label(), "tasks": p.tasks, "tilecast_makespan_s": p.makespan_s,
                         "simgrid_makespan_s": s, "tilecast_wall_s": tw, "simgrid_wall_s": sw,
                         "simgrid_step_wall_s": ss})
            print(f"{p.config.label():<44}{p.tasks:>6}{p.makespan_s:>10.4f}{s:>10.4f}{tw:>9.4f}{sw:>9.3f}{ss:>9.3f}")
        print(timing_line)
        print(json.dumps({**timing, "targets_met": {"speedup": speedup >= TARGET_SPEEDUP},
                          "target_speedup": TARGET_SPEEDUP, "suite": args.suite, "workers": workers,
                          "wall_only": True, "simgrid_footprint_warnings": warnings, "rows": rows,
                          "conditions": conditions}))
        return 0 if speedup >= TARGET_SPEEDUP else 1

    if args.reuse:
        ex = None
        print(f"measured steps and StarPU histories: stored in {store}", file=sys.stderr)
    else:
        print("measuring every configuration afresh", file=sys.stderr)
        ex = execute(preds, preds, machine, cal, host, steps=args.steps, warmup=args.warmup, guard=guard())
        measured = [k.measurement for k in ex.checked]
        print(f"stored for --reuse: {save_measured(store, cfgs, measured)}", file=sys.stderr)

    rows = []
    for m, p, s, tw, sw, ss in zip(measured, preds, sg, tc_wall, sg_wall, sg_step):
        rows.append({
            "config": p.config.label(), "tasks": p.tasks, "real_step_s": m.median_s,
            "real_makespan_s": m.makespan_s, "host_s": p.host_s,
            "tilecast_step_s": p.step_s, "simgrid_step_s": s + p.host_s,
            "tilecast_makespan_s": p.makespan_s, "simgrid_makespan_s": s,
            "tilecast_error": err(p.step_s, m.median_s), "simgrid_error": err(s + p.host_s, m.median_s),
            "tilecast_makespan_error": err(p.makespan_s, m.makespan_s),
            "simgrid_makespan_error": err(s, m.makespan_s),
            "tilecast_wall_s": tw, "simgrid_wall_s": sw, "simgrid_step_wall_s": ss, "real_spread": m.spread,
        })

    print(f"\nStarPU history host {starpu_hostname()!r}, {workers} workers, STARPU_CALIBRATE=1, "
          f"STARPU_HISTORY_MAX_ERROR={HISTORY_MAX_ERROR}; step = makespan + "
          f"tilecast's host cost for both simulators")
    print(f"{'configuration':<44}{'tasks':>6}{'real s':>9}{'tilecast':>10}{'err':>8}{'SimGrid':>10}{'err':>8}"
          f"{'mk err tc':>10}{'mk err sg':>10}{'tc wall':>9}{'sg wall':>9}")
    for r in rows:
        print(f"{r['config']:<44}{r['tasks']:>6}{r['real_step_s']:>9.4f}{r['tilecast_step_s']:>10.4f}"
              f"{r['tilecast_error']:>+8.1%}{r['simgrid_step_s']:>10.4f}{r['simgrid_error']:>+8.1%}"
              f"{r['tilecast_makespan_error']:>+10.1%}{r['simgrid_makespan_error']:>+10.1%}"
              f"{r['tilecast_wall_s']:>9.4f}{r['simgrid_wall_s']:>9.3f}")
    real = [r["real_step_s"] for r in rows]
    tc = ranking_accuracy([r["tilecast_step_s"] for r in rows], real)
    sgf = ranking_accuracy([r["simgrid_step_s"] for r in rows], real)
    abs_mk = {k: np.abs([r[f"{k}_makespan_error"] for r in rows]) for k in ("tilecast", "simgrid")}
    out = {
        "tilecast_median_abs_error": tc["median_abs_error"], "simgrid_median_abs_error": sgf["median_abs_error"],
        "tilecast_max_abs_error": tc["max_abs_error"], "simgrid_max_abs_error": sgf["max_abs_error"],
        **timing,
        "tilecast_makespan_median_abs_error": float(np.median(abs_mk["tilecast"])),
        "simgrid_makespan_median_abs_error": float(np.median(abs_mk["simgrid"])),
        "tilecast_makespan_max_abs_error": float(abs_mk["tilecast"].max()),
        "simgrid_makespan_max_abs_error": float(abs_mk["simgrid"].max()),
        "tilecast_kendall_tau": tc["kendall_tau"], "simgrid_kendall_tau": sgf["kendall_tau"],
        "simgrid_footprint_warnings": warnings,
    }
    met = {"median": out["tilecast_median_abs_error"] <= out["simgrid_median_abs_error"],
           "max": out["tilecast_max_abs_error"] <= out["simgrid_max_abs_error"],
           "speedup": speedup >= TARGET_SPEEDUP}
    print(f"step error  median |err|: tilecast {out['tilecast_median_abs_error']:.1%}, SimGrid "
          f"{out['simgrid_median_abs_error']:.1%}; max: tilecast {out['tilecast_max_abs_error']:.1%}, SimGrid "
          f"{out['simgrid_max_abs_error']:.1%}")
    print(f"makespan error  median |err|: tilecast {out['tilecast_makespan_median_abs_error']:.1%}, SimGrid "
          f"{out['simgrid_makespan_median_abs_error']:.1%}; max: tilecast "
          f"{out['tilecast_makespan_max_abs_error']:.1%}, SimGrid {out['simgrid_makespan_max_abs_error']:.1%}")
    print(timing_line)
    note = ex.busy_note() if ex is not None else None
    if note:
        print(note)
    print(json.dumps({**out, "targets_met": met, "target_speedup": TARGET_SPEEDUP, "suite": args.suite,
                      "workers": workers, "steps": args.steps, "warmup": args.warmup,
                      "learning_pass": not args.no_learning_pass, "reused": args.reuse, "rows": rows, "conditions": conditions}))
    return 0 if all(met.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
