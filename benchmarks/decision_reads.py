"""dmdasd's readings of the queues, counted inside StarPU beside the simulator's, and what one costs there.

To decide where a task goes, dmdasd reads the predicted length of every task
queued ahead of it on each worker (``_starpu_fifo_get_exp_len_prev_task_list``,
src/sched_policies/fifo_queues.c): one call of ``starpu_task_expected_length``
per task read. The other calls of that function in a dmdas or dmdasd step are
the decision's own, one per worker and task (``compute_all_performance_predictions``,
src/sched_policies/deque_modeling_policy_data_aware.c), so a dmdasd step's
calls less a dmdas step's are its readings. libstarpu calls the function
through its procedure linkage table, so a small library preloaded into
``tilecast run`` (built here with the system C compiler) counts every call and
times each one with the processor's time-stamp counter.

Per step it prints: the readings counted in StarPU, the simulator's readings
for the same configuration (:meth:`tilecast.simulator.engine.Engine.decide`,
counted in the Python loop), the time of one call inside StarPU (dmdasd's
calls and dmdas's, the counter's own cost included), the measured steps of
both policies (runs without the counter, alternated with the counted ones)
and what the difference costs per reading, beside the stored
fit's cost per reading (``decision_scan_s``) and the stored models'
predictions of both steps. The time per reading as a step pays it is what the
simulator charges; the time of a call shows how much of that is the call.

Everything here runs dmdasd without a declared priority range
(``TILECAST_PRIORITY_LEVELS=0``; tilecast declares one by default, and its
decisions then read no queued task: ``benchmarks/dmdasd_priority_range.py``),
so the stored fit's cost per reading is the reading path's where the
calibration was taken with that variable set too.

Needs StarPU, a C compiler and a calibration (``tilecast calibrate``); each
round runs both policies with the counter and without it. Last line: one JSON object.

    python3 benchmarks/decision_reads.py                      # gpt2-4x128, 8 x 64, tile 32, 1 worker
    python3 benchmarks/decision_reads.py --workers 2 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

SUITE_MODEL = '{"name": "gpt2-4x128", "n_layer": 4, "n_embd": 128, "n_head": 4, "vocab_size": 2048, "n_positions": 256}'

COUNTER_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <x86intrin.h>
struct starpu_task;
struct starpu_perfmodel_arch;
typedef double (*length_fn)(struct starpu_task *, struct starpu_perfmodel_arch *, unsigned);
static length_fn real_length;
static unsigned long long calls, cycles, tsc0;
static struct timespec wall0;

__attribute__((constructor)) static void started(void)
{
    clock_gettime(CLOCK_MONOTONIC, &wall0);
    tsc0 = __rdtsc();
}

double starpu_task_expected_length(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl)
{
    if (!real_length) {
        real_length = (length_fn)dlsym(RTLD_NEXT, "starpu_task_expected_length");
        if (!real_length) {  /* libstarpu opened later with RTLD_LOCAL: not in the global scope */
            void *h = dlopen("libstarpu-1.3.so.9", RTLD_NOLOAD | RTLD_LAZY);
            if (h) real_length = (length_fn)dlsym(h, "starpu_task_expected_length");
        }
        if (!real_length) abort();
    }
    unsigned long long c = __rdtsc();
    double r = real_length(task, arch, nimpl);
    __atomic_add_fetch(&cycles, __rdtsc() - c, __ATOMIC_RELAXED);
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    return r;
}

__attribute__((destructor)) static void ended(void)
{
    const char *out = getenv("TILECAST_COUNT_OUT");
    if (!out || !calls) return;
    struct timespec w;
    clock_gettime(CLOCK_MONOTONIC, &w);
    double wall = (double)(w.tv_sec - wall0.tv_sec) + 1e-9 * (double)(w.tv_nsec - wall0.tv_nsec);
    FILE *f = fopen(out, "w");
    if (!f) return;
    fprintf(f, "{\"calls\": %llu, \"cycles\": %llu, \"tsc_hz\": %.6e}\n", calls, cycles,
            (double)(__rdtsc() - tsc0) / wall);
    fclose(f);
}
"""


def build_counter(directory: Path) -> Path:
    """The preloadable counter, compiled into ``directory``; exits with one line where it cannot be."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("decision_reads: no C compiler (apt-get install gcc)")
    if os.uname().machine not in ("x86_64", "AMD64"):
        sys.exit(f"decision_reads: the counter reads the x86 time-stamp counter; this is {os.uname().machine}")
    src, lib = directory / "count_length.c", directory / "count_length.so"
    src.write_text(COUNTER_C)
    r = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(src), "-ldl"], capture_output=True,
                       text=True)
    if r.returncode != 0:
        sys.exit(f"decision_reads: building the counter failed: {r.stderr.strip().splitlines()[-1:]}")
    return lib


def run_counted(lib: Path | None, directory: Path, args, sched: str) -> dict:
    """One ``tilecast run`` of ``args.steps`` steps under ``sched``, with the counter preloaded (``lib``) or
    without it (None: the steps as they run, the counter's own cost left out): its JSON and the counter's
    figures."""
    out = directory / f"count_{sched}.json"
    out.unlink(missing_ok=True)
    env = dict(os.environ)  # TILECAST_PRIORITY_LEVELS=0 from main(): StarPU reads the queues
    if lib is not None:
        pre = env.get("LD_PRELOAD", "")  # kept after the counter, as tilecast.executor.mpi_call_times does
        env.update(LD_PRELOAD=f"{lib}{':' + pre if pre else ''}", TILECAST_COUNT_OUT=str(out))
    cmd = [sys.executable, "-m", "tilecast", "run", "--model", args.model, "--batch", str(args.batch), "--seq",
           str(args.seq), "--tile", args.tile, "--sched", sched, "--workers", str(args.workers), "--steps",
           str(args.steps), "--json"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if r.returncode != 0:
        sys.exit(f"decision_reads: `tilecast run --sched {sched}` failed: {(r.stderr or r.stdout).strip()[-400:]}")
    run = json.loads(r.stdout.strip().splitlines()[-1])
    if lib is None:
        return {"run": run}
    if not out.exists():
        sys.exit("decision_reads: the counter saw no call of starpu_task_expected_length (StarPU not linked through "
                 "its procedure linkage table?)")
    return {"run": run, "count": json.loads(out.read_text())}


def simulated(args) -> dict:
    """The stored models' predictions of both policies, and the simulator's readings per dmdasd step."""
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model
    from tilecast.loop.config import StepConfig
    from tilecast.loop.host_cost import fit_key
    from tilecast.loop.predict import predict, stored_models
    from tilecast.perfmodel import load_machine
    from tilecast.simulator import engine

    machine = load_machine("local")
    cal, host = stored_models(machine)
    if cal is None:
        sys.exit("decision_reads: no stored calibration under $TILECAST_HOME (run `tilecast calibrate`)")
    config = StepConfig(load_model(args.model), args.batch, args.seq, Tiling.parse(args.tile), "dmdasd", args.workers)
    read = [0]
    decide = engine.Engine.decide

    def counting(self, locked, scanned, by=-1):
        read[0] += scanned
        return decide(self, locked, scanned, by)

    engine.Engine.decide, native = counting, engine.Engine.native_loop
    engine.Engine.native_loop = False  # the C loop counts nothing: the Python loop, which gives the same steps
    try:
        dmdasd = predict(config, machine, cal, host)
    finally:
        engine.Engine.decide, engine.Engine.native_loop = decide, native
    dmdas = predict(replace(config, sched="dmdas"), machine, cal, host)
    fit = (host or {}).get(fit_key(args.workers, "dmdasd"))
    return {"readings": read[0], "dmdasd_step_s": dmdasd.step_s, "dmdas_step_s": dmdas.step_s,
            "decision_scan_s": getattr(fit, "decision_scan_s", None),
            "decision_lock_s": getattr(fit, "decision_lock_s", None)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=SUITE_MODEL, help="a preset, config.json or inline JSON (default: the "
                    "accuracy suite's gpt2-4x128)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--tile", default="32")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--steps", type=int, default=6, help="steps per run, the first a warm-up (default 6)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each policy, alternated (default 2)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one run may take (default 900)")
    args = ap.parse_args(argv)
    # the readings are studied where StarPU makes them: no priority range declared, in the runs and the simulator
    # alike (tilecast declares one for dmdasd by default, whose decisions then read one sum per worker:
    # tilecast.graph.priorities.declared_range)
    os.environ["TILECAST_PRIORITY_LEVELS"] = "0"
    for flag in ("batch", "seq", "workers", "rounds"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag}: at least 1, got {getattr(args, flag)}")
    if args.steps < 2:
        ap.error(f"--steps: at least 2 (the first warms up), got {args.steps}")
    from tilecast.perfmodel.local import conditions_line, run_conditions

    conditions = run_conditions()
    print(conditions_line(conditions))
    sim = simulated(args)
    runs = {"dmdas": [], "dmdasd": []}
    plain = {"dmdas": [], "dmdasd": []}
    with tempfile.TemporaryDirectory(prefix="tilecast-reads-") as tmp:
        lib = build_counter(Path(tmp))
        for _ in range(args.rounds):  # the counted runs and the plain ones, whose steps the counter does not slow
            for sched in runs:
                runs[sched].append(run_counted(lib, Path(tmp), args, sched))
                plain[sched].append(run_counted(None, Path(tmp), args, sched))
    per_step = {s: [r["count"]["calls"] / args.steps for r in rs] for s, rs in runs.items()}
    ns_per_call = {s: float(np.median([1e9 * r["count"]["cycles"] / r["count"]["calls"] / r["count"]["tsc_hz"]
                                       for r in rs])) for s, rs in runs.items()}
    step = {s: float(np.median([r["run"]["step_s"] for r in rs])) for s, rs in plain.items()}
    counted_step = {s: float(np.median([r["run"]["step_s"] for r in rs])) for s, rs in runs.items()}
    tasks = runs["dmdas"][0]["run"]["tasks"]
    readings = float(np.median(per_step["dmdasd"]) - np.median(per_step["dmdas"]))
    paid = (step["dmdasd"] - step["dmdas"]) / readings if readings > 0 else float("nan")
    print(f"{args.model if not args.model.startswith('{') else json.loads(args.model).get('name')} "
          f"{args.batch}x{args.seq} tile {args.tile}, {args.workers} worker(s), {tasks} tasks; "
          f"{args.rounds} runs of {args.steps} steps per policy")
    print(f"  calls per step: dmdas {np.median(per_step['dmdas']):,.0f} (tasks x workers: {tasks * args.workers:,}), "
          f"dmdasd {np.median(per_step['dmdasd']):,.0f}")
    print(f"  readings per step: StarPU {readings:,.0f}, simulated {sim['readings']:,} "
          f"({sim['readings'] / readings - 1:+.1%})" if readings > 0 else "  no readings counted")
    print(f"  one call inside StarPU (counter included): dmdas {ns_per_call['dmdas']:.0f} ns, "
          f"dmdasd {ns_per_call['dmdasd']:.0f} ns")
    print(f"  step: dmdas {step['dmdas'] * 1e3:.1f} ms (predicted {sim['dmdas_step_s'] * 1e3:.1f}), dmdasd "
          f"{step['dmdasd'] * 1e3:.1f} ms (predicted {sim['dmdasd_step_s'] * 1e3:.1f}); with the counter "
          f"{counted_step['dmdas'] * 1e3:.1f} and {counted_step['dmdasd'] * 1e3:.1f} ms")
    fitted, lock = sim["decision_scan_s"], sim["decision_lock_s"]
    locks = f"{args.workers - 1} other worker(s) locked a decision" if args.workers > 1 else "no other worker to lock"
    print(f"  dmdasd's step less dmdas's, per reading: {paid * 1e9:.0f} ns ({locks}); the stored fit charges "
          + (f"{fitted * 1e9:.0f} ns a reading and {lock * 1e6:.2f} us a decision per other worker locked"
             if fitted is not None else "nothing (no dmdasd fit stored)"))
    print(json.dumps({"tasks": tasks, "workers": args.workers, "calls_per_step": per_step,
                      "readings_per_step": readings, "simulated_readings_per_step": sim["readings"],
                      "ns_per_call": ns_per_call, "step_s": step, "counted_step_s": counted_step,
                      "predicted_step_s": {"dmdas": sim["dmdas_step_s"], "dmdasd": sim["dmdasd_step_s"]},
                      "reading_paid_s": paid, "fitted_reading_s": fitted, "fitted_lock_s": lock,
                      "conditions": conditions}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
