"""Simulator speed: a gpt2-xl step on the 8x H100 description with transfers, every policy,
against a bare heapq replay of the same graph with fixed durations on as many workers.

The replay is the floor of any Python discrete-event simulation of the graph: a
heap of task ends, a FIFO of ready tasks, no data, no policy. The simulation of
``--sched`` and the replay run in the same process, interleaved, fastest of
``--repeats`` runs each, so their ratio holds even on a loaded machine; CPU-time
rates are printed too. The simulation time covers all of ``simulate()``
(priorities, footprint estimates, data structures, the run, the summary); the
duration model is timed apart.
Target: >= 300,000 simulated tasks/s on a graph of over a million tasks (the
default, gpt2-xl batch 8 x 1024 at tile 128: 2,023,471 tasks) for ``--sched``
and every other policy (``per_policy``: one run each, its own ``target_met``);
the JSON also gives the peak resident memory per task (the whole process:
graph, durations and simulations), the resident memory before the first
simulation, and per policy how far above that level the process's resident
memory peaked during its run (Linux's VmHWM, reset before each run; memory that
earlier runs freed and the allocator kept is reused, so only the first run's
figure is what a simulation needs from a fresh process).

simulate() runs every policy in C (tilecast/simulator/native.py; the line
"loop" says whether it did). One run of the Python loops (the dm family's fused
loop, compiled by Cython where it can be built; the general engine for the
others) is timed beside it after the C runs (--no-python skips it), and the
benchmark fails if the two disagree on any task's start, end or worker or on any
transfer.

Figures measured with this script are in docs/benchmarks.md. What limits the C
loop: dmdasd's decision sums the predicted lengths queued ahead of the task on
every worker, in queue order (StarPU walks its list the same way); the C loop
keeps those sums between pushes but must redo them from the front after each
pop, and on this graph the queues hold thousands of ready tasks, so that sum
(a chain of dependent additions, which must stay in order to give Python's
result) is a third of dmdasd's time. Elsewhere the loop takes 0.7-1.4 s of a
2-million-task run, and the rest of simulate() is numpy work around it
(priorities, footprints, the summary), 0.3-0.8 s.
Run: python3 benchmarks/simulator_speed.py [--model gpt2-xl --batch 8 --seq 1024 --tile 128
     --machine h100-sxm5-80gb-8 --sched dmda --policies all]
"""

from __future__ import annotations

import argparse
import heapq
import resource
import json
import os
import sys
import time
from collections import deque

import numpy as np

# measure the checkout this file is in, not whichever tilecast is installed
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tilecast.graph import Tiling  # noqa: E402
from tilecast.graph.gpt2 import build_gpt2_step  # noqa: E402
from tilecast.graph.model_config import load_model  # noqa: E402
from tilecast.perfmodel import load_machine  # noqa: E402
from tilecast.perfmodel.kernel_model import DurationModel  # noqa: E402
from tilecast.simulator import compiled, native  # noqa: E402
from tilecast.simulator import simulate as sim  # noqa: E402
from tilecast.simulator.dag import successors  # noqa: E402
from tilecast.simulator.engine import Engine  # noqa: E402
from tilecast.perfmodel.local import conditions_line, run_conditions

TARGET_TASKS_PER_S = 300_000


def heapq_replay(duration: np.ndarray, pred_ptr: np.ndarray, pred: np.ndarray, n_workers: int) -> float:
    """List scheduling with a heap of ends and a FIFO of ready tasks; returns the makespan."""
    n = len(duration)
    succ_ptr, succ = successors(pred_ptr, pred, n)
    succ_ptr, succ = succ_ptr.tolist(), succ.tolist()
    missing = np.diff(pred_ptr).tolist()
    dur = duration.tolist()
    ready = deque(i for i in range(n) if missing[i] == 0)
    events = []
    free = n_workers
    now = 0.0
    while ready or events:
        while free and ready:
            t = ready.popleft()
            heapq.heappush(events, (now + dur[t], t))
            free -= 1
        now, t = heapq.heappop(events)
        free += 1
        for s in succ[succ_ptr[t]:succ_ptr[t + 1]]:
            missing[s] -= 1
            if missing[s] == 0:
                ready.append(s)
    return now


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2-xl")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--tile", default="128")
    ap.add_argument("--machine", default="h100-sxm5-80gb-8")
    ap.add_argument("--sched", default="dmda")
    ap.add_argument("--repeats", type=int, default=2,
                    help="runs of each; the fastest counts (the cores may be shared) (default: 2)")
    ap.add_argument("--no-python", action="store_true",
                    help="skip the one run of the Python loops timed and checked beside the C loop")
    ap.add_argument("--policies", default="all",
                    help="also simulate these policies once each, comma-separated, for per_policy "
                         "(default: all the simulator offers; 'none' to skip)")
    args = ap.parse_args()
    conditions = run_conditions()
    print(conditions_line(conditions))
    cfg, tiling = load_model(args.model), Tiling.parse(args.tile)
    machine = load_machine(args.machine)
    g = build_gpt2_step(cfg, args.batch, args.seq, tiling)
    pred_ptr, pred = g.dependencies
    t0 = time.perf_counter()
    durations = DurationModel(machine).durations(g)
    model_s = time.perf_counter() - t0
    n = g.n_tasks
    print(f"{cfg.name}, batch {args.batch} x {args.seq}, tiling {tiling}: {n:,} tasks", flush=True)

    fixed = durations.min(axis=0) + machine.task_overhead
    loop_native = native.library() is not None  # builds it on first use, before timing
    compiled.fused_loop_module()
    rss_before = _rss_now()
    sim_s = replay_s = sim_cpu = replay_cpu = float("inf")
    for _ in range(max(1, args.repeats)):  # interleaved, so both see the same load
        t0, c0 = time.perf_counter(), time.process_time()
        res = sim.simulate(g, machine, args.sched, durations=durations, transfers=True)
        sim_s, sim_cpu = min(sim_s, time.perf_counter() - t0), min(sim_cpu, time.process_time() - c0)
        t0, c0 = time.perf_counter(), time.process_time()
        replay_makespan = heapq_replay(fixed, pred_ptr, pred, len(machine.workers))
        replay_s, replay_cpu = min(replay_s, time.perf_counter() - t0), min(replay_cpu, time.process_time() - c0)

    per_policy = {}
    names = list(sim.POLICIES) if args.policies == "all" else [] if args.policies == "none" else \
        [x.strip() for x in args.policies.split(",") if x.strip()]
    for name in names:  # one run each (the fastest of the repeats for --sched), its memory measured apart
        before = _rss_now()
        reset = _reset_peak_rss()
        t0, c0 = time.perf_counter(), time.process_time()
        sim.simulate(g, machine, name, durations=durations, transfers=True)
        w, c = time.perf_counter() - t0, time.process_time() - c0
        added = (_peak_rss() - before) / n if reset else None
        if name == args.sched:
            w, c = min(w, sim_s), min(c, sim_cpu)
        per_policy[name] = {"sim_s": w, "tasks_per_s": n / w, "tasks_per_cpu_s": n / c,
                            "target_met": bool(n / w >= TARGET_TASKS_PER_S), "peak_added_bytes_per_task": added}
        print(f"  {name:<8}{w:>8.2f} s  {n / w:>12,.0f} tasks/s  ({n / c:,.0f} per CPU second)"
              + (f"  {added:,.0f} B per task at its peak" if added is not None else ""), flush=True)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # before the Python loops' objects

    py_s = py_cpu = None
    if loop_native and not args.no_python:  # one run of the Python loops, timed and checked
        Engine.native_loop = False
        try:
            t0, c0 = time.perf_counter(), time.process_time()
            py = sim.simulate(g, machine, args.sched, durations=durations, transfers=True)
            py_s, py_cpu = time.perf_counter() - t0, time.process_time() - c0
        finally:
            Engine.native_loop = True
        same = all(np.array_equal(a, b) for a, b in [(py.start, res.start), (py.end, res.end),
                                                     (py.worker, res.worker)]) and \
            all(np.array_equal(py.transfers[k], res.transfers[k]) for k in res.transfers)
        if not same:
            raise SystemExit("the C loop and the Python loops disagree")

    added_sched = per_policy.get(args.sched, {}).get("peak_added_bytes_per_task")
    s = res.summary
    out = {
        "model": cfg.name, "batch": args.batch, "seq": args.seq, "tiling": tiling.describe(),
        "machine": machine.name, "sched": args.sched, "workers": len(machine.workers),
        "tasks": n, "transfers": s["transfers"], "bytes_moved": s["bytes_moved"],
        "duration_model_s": model_s, "sim_s": sim_s, "replay_s": replay_s,
        "sim_cpu_s": sim_cpu, "replay_cpu_s": replay_cpu, "sim_tasks_per_cpu_s": n / sim_cpu,
        "replay_tasks_per_cpu_s": n / replay_cpu,
        "sim_tasks_per_s": n / sim_s, "replay_tasks_per_s": n / replay_s, "ratio": (n / sim_s) / (n / replay_s),
        "makespan_s": s["makespan_s"], "replay_makespan_s": replay_makespan,
        "critical_path_s": s["critical_path_s"], "target_tasks_per_s": TARGET_TASKS_PER_S,
        "native_loop": loop_native, "compiled_fused_loop": bool(compiled.fused_loop_module().COMPILED),
        "python_sim_s": py_s, "python_sim_cpu_s": py_cpu,
        "python_sim_tasks_per_s": n / py_s if py_s else None,
        "target_met": bool(n / sim_s >= TARGET_TASKS_PER_S),
        "all_policies_met": bool(per_policy) and all(v["target_met"] for v in per_policy.values()),
        "cpus": os.cpu_count(), "per_policy": per_policy,
        "peak_rss_bytes_per_task": peak_rss / n, "rss_before_simulating_bytes_per_task": rss_before / n,
        "sim_peak_added_bytes_per_task": added_sched,
    }
    print(f"{cfg.name}, batch {args.batch} x {args.seq}, tiling {tiling}, {machine.name}, {args.sched}")
    rows = [
        ("tasks", f"{n:,}"),
        ("transfers", f"{s['transfers']:,} ({s['bytes_moved'] / 1e9:.1f} GB)"),
        ("duration model", f"{model_s:.2f} s"),
        (f"simulation ({args.sched} + transfers)",
         f"{sim_s:.2f} s = {n / sim_s:,.0f} tasks/s (target >= {TARGET_TASKS_PER_S:,})"),
        ("loop", "C (tilecast/simulator/native.py)" if loop_native else "Python (no C build)"),
        *([("Python loops, one run", f"{py_s:.2f} s = {n / py_s:,.0f} tasks/s "
                                     f"({n / py_cpu:,.0f} per CPU second); same results")] if py_s else []),
        ("bare heapq replay", f"{replay_s:.2f} s = {n / replay_s:,.0f} tasks/s"),
        ("ratio simulation / replay", f"{out['ratio']:.3f}"),
        ("per CPU second (shared cores)", f"simulation {n / sim_cpu:,.0f} tasks/s, replay {n / replay_cpu:,.0f} tasks/s"),
        ("every policy >= target", "yes" if out["all_policies_met"] else
         "no: " + ", ".join(k for k, v in per_policy.items() if not v["target_met"])),
        ("memory per task", f"peak {peak_rss / n:,.0f} B (process), {rss_before / n:,.0f} B before simulating"
                            + (f", {added_sched:,.0f} B more at the peak of a {args.sched} simulation"
                               if added_sched is not None else "")),
        ("predicted step", f"{s['makespan_s'] * 1e3:.1f} ms (critical path {s['critical_path_s'] * 1e3:.1f} ms)"),
    ]
    for k, v in rows:
        print(f"  {k:<32}{v}")
    # the last line's four headline figures, then the rest
    head = {k: out[k] for k in ("tasks", "sim_tasks_per_s", "replay_tasks_per_s", "ratio")}
    print(json.dumps({**head, **out, "conditions": conditions}))


def _reset_peak_rss() -> bool:
    """Start the kernel's peak resident memory count (VmHWM) over from now (Linux; False elsewhere)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss() -> int:
    """Peak resident memory (VmHWM) since the last reset, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _rss_now() -> int:
    """Resident memory of this process now, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


if __name__ == "__main__":
    main()
