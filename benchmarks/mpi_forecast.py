"""Predicted against measured: a training step on 2 StarPU-MPI ranks of one worker, per distribution and tiling.

For every distribution x tiling, the rank simulator's forecast
(:func:`tilecast.loop.ranks_forecast.forecast_ranks`: the stored kernel calibration and the network
``tilecast calibrate --ranks 2`` stored) beside ``--repeats`` runs of ``tilecast run --ranks 2``
(:func:`tilecast.executor.mpi_launch.run_mpi`, ``--steps`` steps each; a run's step time is the median
of its steps after the first), in rounds that run every configuration once (``--order rounds``; ``blocks``: a
configuration's runs one after another, the earlier order). Reports the median over the runs and their spread
(min-max), the error of the forecast against the median, and the bytes moved per step, measured (StarPU-MPI's
count) and predicted. Run ``tilecast calibrate`` (kernels, with ``--model``/``--tile``/``--tiles`` covering these
tilings) and ``tilecast calibrate --ranks 2`` first.

``--progress`` is ``run --ranks``'s choice for StarPU-MPI's progress thread (``auto``: it runs worker 0
where the threads would outnumber the cores; ``own``: a thread of its own); the forecast models the
same. ``--main-thread`` is its rule for the main thread (``first``: pinned to its worker's core, the rank's
other threads below it, :func:`tilecast.executor.mpi_threads.main_thread_first`; ``fair``: as before it).
Other work on the machine is measured before each round (its median over the rounds taken for every
configuration; ``blocks``: before each configuration's runs), as the share of a core that
as many spinning threads as the ranks keep busy get in a session of their own for 1 s
(``--count share``, :func:`tilecast.loop.ranks_load.measured_share`; ``run --ranks`` starts its ranks in
a session of their own, and Linux shares the CPU between sessions before threads), turned into the
background threads that leave the ranks' threads that share. ``--count groups`` counts the runnable
threads of every other session instead (:func:`tilecast.loop.ranks_load.background_now`), ``--count
threads`` all runnable threads (``procs_running``, the earlier way); all three are in the JSON
(``other_work``), and the forecast without other work is printed beside it; so are the forecast of the model
before the ranks' main threads and the ping-pong's per-protocol costs were modelled (``before``,
``pred_step_before_s``, ``error_before``: ``forecast_ranks(..., main_threads=False)`` on the network without
``protocol_s``) and the forecast with Open MPI's pipelined rendezvous turns (``+pipe``,
``pred_step_pipeline_turns_s``: ``pipeline_turns=True``), and the forecast with one CPU time per submitted
task and no CPU per message on the progress threads (``flat``, ``pred_step_flat_s``: ``submit_roles=False,
message_cpu=False``), and the forecast with the main thread given half its rank's slots while it submits
(``even``, ``pred_step_even_share_s``: ``submit_share=False``) instead of the probe's measured part, and the
forecast without the worker's per-task round of the progress loop and with ``message_s / 2`` of CPU per message
(``no tc``, ``pred_step_before_task_costs_s``, ``error_before_task_costs``: ``task_costs=False``) instead of the
probe's measured ``progress_task_s`` and ``message_cpu_s``, and the forecast with a rank's main thread and worker
sharing the worker's slots at their parts of its speed throughout (``no tn``, ``pred_step_no_turns_s``,
``error_no_turns``: ``submit_turns=False``) instead of in turns of a time slice, and the forecast with the main
threads' CPU per task by role fitted without a cost per implicit dependency (``no dp``, ``pred_step_no_deps_s``,
``error_no_deps``: the probe's ``submit_roles_no_deps``). ``submit_cpu_predicted_s`` is each rank's submission
CPU as the forecast charges it (beside ``submit_cpu_s``, measured). The machine's speed against its kernels'
calibration (``tilecast calibrate --check``'s reference step, now over then) is timed before the runs and after
each round (``speed_checks``, their median ``speed``); ``at spd`` (``pred_step_at_speed_s``, ``error_at_speed``)
is the forecast times that median: what the forecast would be had the kernels been calibrated at the speed the
machine ran the configurations at, a check of how much of an error is the guest's drift (the reference step is
neither of these configurations nor run on StarPU-MPI). ``kernel_predicted_s`` is each rank's predicted kernel time as ``busy_s`` measures it
(StarPU's profiling, start to end of each task); ``busy_predicted_s`` adds the runtime's cost between tasks.
``thread_cpu`` (with ``--threads``): per run and rank, each thread group's seconds on a core and waiting for one over a step
(:func:`tilecast.executor.mpi_threads.thread_groups`, the scheduler's ``schedstat`` counts);
``cpu_over_cores_wall``: the ranks' threads' CPU over cores x the step; ``worker_wait_beyond_main_s``: per rank,
what its worker thread waited for a core beyond its own main thread's CPU (taken by the other rank's threads or
by other work: near 0 where the ranks had the machine to themselves).

    python3 benchmarks/mpi_forecast.py [--repeats 3] [--steps 4] [--tiles "64,batch=1;128,batch=1;32,batch=1"]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

import numpy as np
from tqdm import tqdm

from tilecast.executor.mpi_launch import run_mpi
from tilecast.executor.mpi_threads import progress_drives_worker, runnable_others, runnable_threads, thread_groups
from tilecast.loop.ranks_load import background_from_share, background_now, measured_share
from tilecast.graph import Tiling
from tilecast.graph.model_config import load_model
from tilecast.loop.predict import stored_models
from tilecast.perfmodel import load_machine
from tilecast.perfmodel.local import conditions_line, run_conditions
from tilecast.loop.ranks_forecast import forecast_ranks, network_or_error

MODEL = '{"n_layer":4,"n_embd":128,"n_head":4,"vocab_size":512,"n_positions":128}'
BATCH, SEQ = 4, 64


def submission_cpu(cfg, tiling, dist: str, ranks: int, roles: dict | None) -> list | None:
    """Each rank's main-thread CPU over the step as the forecast charges it (the network's ``submit_roles``)."""
    if not roles:
        return None
    from tilecast.graph.distribution import prepare
    from tilecast.graph.models import build_step
    from tilecast.graph.owner_computes import plan
    from tilecast.simulator.submit_roles import role_counts, task_seconds

    g, d = prepare(build_step(cfg, BATCH, SEQ, tiling), ranks, dist)
    p = plan(g, d.owner, ranks)
    return task_seconds(roles, role_counts(p.task_rank, p.transfers, ranks, g)).sum(axis=1).tolist()


def other_work(ours: int, cores: int) -> dict:
    """Other work on the machine now, counted three ways (module docstring, ``--count``)."""
    load = background_now(ours, cores)
    load["threads_procs_running"] = runnable_others()
    load["share"] = measured_share(ours)
    load["background_share"] = background_from_share(load["share"], ours, cores)
    return load


def speed_now() -> dict | None:
    """``tilecast calibrate --check`` now (the reference step against the one the kernels were calibrated beside):
    its figures, or None where it cannot be timed."""
    from tilecast.api.calibration import check_speed

    try:
        c = check_speed()
    except ValueError:  # FieldError: no calibration with a reference step, or StarPU does not run here
        return None
    return {"ratio": c.ratio, "reference_now_s": c.reference_now_s, "reference_calibrated_s": c.reference_calibrated_s}


def median_load(loads: list) -> dict:
    """Each figure of :func:`other_work` at its median over ``loads`` (one moment's other work, a transient, does
    not stand for a whole pass)."""
    return {k: float(np.median([x[k] for x in loads])) for k in loads[0]}


def measure(cfg, configs: list, args, ours: int, cores: int) -> tuple[dict, dict, list]:
    """Per configuration, ``--repeats`` runs' figures and the other work on the machine that its forecast takes:
    in rounds (``--order rounds``: every configuration once a round, so that a slow or fast spell of the machine
    falls on all of them alike; other work counted before each round, its median for every configuration) or one
    configuration's runs after another (``blocks``, the earlier order: other work counted before each
    configuration's runs). Also the machine's speed against its calibration (:func:`speed_now`) before the runs
    and after each round (``blocks``: after the runs)."""
    measured = {c: dict(runs=[], moved=None, busy=[], submit=[], submit_cpu=[], drives=None, threads=[], last=None)
                for c in configs}
    n = 0 if args.predict_only else args.repeats
    rounds = args.order == "rounds"
    order = [c for _ in range(n) for c in configs] if rounds else [c for c in configs for _ in range(n)]
    speeds = [speed_now()] if order and args.speed_check else []
    loads = {c: [] for c in configs}
    for i, (dist, tile) in enumerate(tqdm(order, desc="runs", unit="run", disable=not order, file=sys.stderr)):
        if i and args.speed_check and rounds and i % len(configs) == 0:
            speeds.append(speed_now())
        if rounds and i % len(configs) == 0:
            now = other_work(ours, cores)
            for c in configs:
                loads[c].append(now)
        elif not rounds and i % n == 0:
            loads[dist, tile].append(other_work(ours, cores))
        m = measured[dist, tile]
        r = run_mpi(cfg, BATCH, SEQ, Tiling.parse(tile), args.sched, 1, args.steps, args.ranks, dist, timeout_s=900,
                    progress=args.progress, read_threads=args.threads, main_first=args.main_thread == "first")
        m["drives"], m["moved"], m["last"] = r.progress_drives_worker, r.bytes_moved[-1], r
        m["runs"].append(r.median_step_s)
        ok = r.task_rank >= 0
        m["busy"].append(np.bincount(r.task_rank[ok], weights=(r.end_s - r.start_s)[ok],
                                     minlength=args.ranks).tolist())
        m["submit"].append(np.median(r.submit_s[:, 1:] if r.submit_s.shape[1] > 1 else r.submit_s, axis=1).tolist())
        if r.threads is not None:
            m["threads"].append(thread_groups(r.threads))
        if r.submit_cpu_s is not None:
            c = r.submit_cpu_s
            m["submit_cpu"].append(np.median(c[:, 1:] if c.shape[1] > 1 else c, axis=1).tolist())
    if order and args.speed_check:
        speeds.append(speed_now())
    for c in configs:  # --predict-only: other work now
        loads[c] = median_load(loads[c]) if loads[c] else other_work(ours, cores)
    return measured, loads, speeds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--sched", default="lws")
    ap.add_argument("--distributions", default="data,layer")
    ap.add_argument("--tiles", default="64,batch=1;128,batch=1;32,batch=1")
    ap.add_argument("--predict-only", action="store_true")
    ap.add_argument("--no-speed-check", dest="speed_check", action="store_false",
                    help="skip timing the reference step before the runs and after each round (about 2 s each; "
                         "the 'at spd' column then reads nan)")
    ap.add_argument("--order", choices=("rounds", "blocks"), default="rounds",
                    help="rounds: each round runs every configuration once (a spell of the machine falls on all "
                         "alike); blocks: one configuration's runs, then the next's (the earlier order)")
    ap.add_argument("--traces", metavar="DIR",
                    help="write, per configuration, the forecast's trace and the last run's merged trace "
                         "(DIR/<distribution>-<tiling>-pred.parquet, -real.parquet) for tilecast compare")
    ap.add_argument("--progress", choices=("auto", "own"), default="auto")
    ap.add_argument("--main-thread", choices=("first", "fair"), default="first",
                    help="first (run --ranks's rule): each rank's main thread pinned to its worker's core, the "
                         "rank's other threads below it while it submits; fair: every thread at one level, "
                         "unpinned, as before (the forecast keeps the submit_share calibrate --ranks measured)")
    ap.add_argument("--threads", action="store_true",
                    help="read every rank's threads' scheduler counts in each step (thread_cpu in the JSON; "
                         "0.1-0.3 ms of each rank's main thread per reading, two inside each step: a pass "
                         "for the forecast's error runs without it)")
    ap.add_argument("--count", choices=("share", "groups", "threads"), default="share",
                    help="how other work becomes background threads: the measured share of a core (default), "
                         "runnable threads per session, or runnable threads")
    args = ap.parse_args()
    conditions = run_conditions()
    print(conditions_line(conditions))
    load_before = os.getloadavg()[0]
    print(f"load average before: {load_before:.2f}")
    cfg = load_model(MODEL)
    machine = load_machine("local")
    calibration, host_costs = stored_models(machine)
    net = network_or_error(machine, args.ranks, 1)
    print(f"model {MODEL}, batch {BATCH} x {SEQ}, {args.sched}, {args.ranks} ranks of 1 worker, "
          f"{args.repeats} runs of {args.steps} steps, main thread {args.main_thread}; kernels: {'stored calibration' if calibration else 'roofline'}; "
          f"network: {net.latency_s * 1e6:.0f} us + {net.message_s * 1e6:.0f} us/msg + B/{net.bandwidth_Bps / 1e9:.2f} GB/s")
    print(f"{'distribution':<13}{'tiling':<14}{'grp':>4}{'bg':>5}{'pred ms':>9}{'(no bg)':>9}{'before':>9}{'+pipe':>7}"
          f"{'flat':>7}{'even':>7}"
          f"{'no tc':>7}{'meas ms':>9}"
          f"{'min-max ms':>17}{'err %':>7}{'before %':>9}{'no tc %':>8}{'no tn %':>8}{'no dp %':>8}{'at spd %':>9}"
          f"{'moved B':>10}"
          f"{'pred B':>10}"
          f"{'msgs':>6}")
    rows = []
    configs = [(dist, tile) for dist in args.distributions.split(",") for tile in args.tiles.split(";")]
    cores = int(machine.meta["hardware"]["cores"])
    ours = args.ranks * runnable_threads(1, args.progress == "auto" and progress_drives_worker(args.ranks, 1, cores))
    measured, loads, speeds = measure(cfg, configs, args, ours, cores)
    ratios = [x["ratio"] for x in speeds if x]
    speed = float(np.median(ratios)) if ratios else float("nan")
    if ratios:
        print(f"machine speed against the kernels' calibration (reference step now / then, before the runs and "
              f"after each round): {', '.join(f'{r:.3f}' for r in ratios)}; median {speed:.3f}")
    for dist, tile in configs:
        tiling = Tiling.parse(tile)
        load = loads[dist, tile]
        bg = {"share": load["background_share"], "groups": load["background"],
              "threads": load["threads_procs_running"]}[args.count]
        f = forecast_ranks(cfg, BATCH, SEQ, tiling, args.sched, args.ranks, dist, machine, calibration,
                           host_costs, net, 1, progress=args.progress, background=bg, keep_result=True)
        # the kernels' time per rank as the runs measure it (StarPU's profiling: start to end of each task),
        # without the runtime's cost between tasks that busy_s adds
        kernel_pred = np.bincount(f.result.task_rank, weights=f.result.end - f.result.start,
                                  minlength=args.ranks).tolist()
        # the submission at one CPU time per task (the probe's mean) and without the progress thread's
        # CPU per message: the rules this model added on 2026-12-01
        ff = forecast_ranks(cfg, BATCH, SEQ, tiling, args.sched, args.ranks, dist, machine, calibration,
                            host_costs, net, 1, progress=args.progress, background=bg, submit_roles=False,
                            message_cpu=False)
        stem = os.path.join(args.traces, f"{dist}-{tile.replace(',', '_').replace('=', '')}") if args.traces else ""
        if args.traces:
            from tilecast.graph.distribution import prepare
            from tilecast.graph.models import build_step
            from tilecast.simulator.ranks import ranks_trace
            from tilecast import trace as tracefile

            os.makedirs(args.traces, exist_ok=True)
            g, _ = prepare(build_step(cfg, BATCH, SEQ, tiling), args.ranks, dist)
            tracefile.save(ranks_trace(f.result, g), stem + "-pred.parquet", g)
        # the main thread's half of its rank's slots while it submits, the rule before the probe measured it
        fe = forecast_ranks(cfg, BATCH, SEQ, tiling, args.sched, args.ranks, dist, machine, calibration,
                            host_costs, net, 1, progress=args.progress, background=bg, submit_share=False)
        # the worker's per-task round of the progress loop and per-message CPU as before the probe measured
        # them (none, and message_s / 2): the model before 2026-12-01's task costs
        ft = forecast_ranks(cfg, BATCH, SEQ, tiling, args.sched, args.ranks, dist, machine, calibration,
                            host_costs, net, 1, progress=args.progress, background=bg, task_costs=False)
        # the main thread and its worker sharing the worker's slots at their parts of its speed throughout,
        # not in turns of a slice: the rule before 2026-12-07
        fn = forecast_ranks(cfg, BATCH, SEQ, tiling, args.sched, args.ranks, dist, machine, calibration,
                            host_costs, net, 1, progress=args.progress, background=bg, submit_turns=False)
        f0 = forecast_ranks(cfg, BATCH, SEQ, tiling, args.sched, args.ranks, dist, machine, calibration,
                            host_costs, net, 1, progress=args.progress)
        # the main threads' CPU by role without a cost per implicit dependency: the earlier rule
        flat_roles = (net.probe or {}).get("submit_roles_no_deps")
        fd = (forecast_ranks(cfg, BATCH, SEQ, tiling, args.sched, args.ranks, dist, machine, calibration,
                             host_costs, replace(net, submit_roles=flat_roles), 1, progress=args.progress,
                             background=bg) if flat_roles else None)
        submit_cpu_pred = submission_cpu(cfg, tiling, dist, args.ranks, net.submit_roles)
        # the model before the main threads' submission and the ping-pong's per-protocol costs were
        # modelled; and the model with the pipelined rendezvous' turns (pipeline_turns)
        fb = forecast_ranks(cfg, BATCH, SEQ, tiling, args.sched, args.ranks, dist, machine, calibration,
                            host_costs, replace(net, protocol_s=None), 1, progress=args.progress, background=bg,
                            main_threads=False)
        fp = forecast_ranks(cfg, BATCH, SEQ, tiling, args.sched, args.ranks, dist, machine, calibration,
                            host_costs, net, 1, progress=args.progress, background=bg, pipeline_turns=True)
        m = measured[dist, tile]
        runs, moved, busy, submit, submit_cpu, drives, threads = (m[k] for k in (
            "runs", "moved", "busy", "submit", "submit_cpu", "drives", "threads"))
        if args.traces and runs:
            from tilecast.executor.mpi_trace import merged_trace, save_merged

            save_merged(merged_trace(m["last"]), stem + "-real.parquet", m["last"])
        med = float(np.median(runs)) if runs else float("nan")
        err = (f.step_s - med) / med if runs else float("nan")
        err_before = (fb.step_s - med) / med if runs else float("nan")
        err_costs = (ft.step_s - med) / med if runs else float("nan")
        err_turns = (fn.step_s - med) / med if runs else float("nan")
        err_deps = (fd.step_s - med) / med if runs and fd else float("nan")
        err_speed = (f.step_s * speed - med) / med if runs else float("nan")
        row = dict(distribution=dist, tiling=tile, background_threads=bg, other_work=load, pred_step_s=f.step_s,
                   pred_step_no_background_s=f0.step_s, pred_step_before_s=fb.step_s, error_before=err_before,
                   pred_step_pipeline_turns_s=fp.step_s, pred_step_before_task_costs_s=ft.step_s,
                   error_before_task_costs=err_costs, pred_step_no_turns_s=fn.step_s, error_no_turns=err_turns,
                   pred_step_no_deps_s=fd.step_s if fd else None, error_no_deps=err_deps,
                   pred_step_at_speed_s=f.step_s * speed, error_at_speed=err_speed,
                   submit_cpu_predicted_s=submit_cpu_pred,
                   submit_end_predicted_s=(f.summary.get("threads") or {}).get("submit_end_s"),
                   progress_drives_worker=drives,
                   threads=f.summary.get("threads"), step_s=med, runs_s=runs,
                   error=err, bytes_moved=moved, bytes_moved_predicted=f.bytes_moved, messages=f.messages,
                   tasks=f.tasks, core_share=f.core_share,
                   busy_s=busy, busy_predicted_s=[x["busy_s"] for x in f.summary["per_rank"]],
                   kernel_predicted_s=kernel_pred, pred_step_flat_s=ff.step_s, pred_step_even_share_s=fe.step_s,
                   load_average=os.getloadavg()[0],
                   submit_s=submit, submit_cpu_s=submit_cpu, thread_cpu=threads)
        if threads:
            # the ranks' threads' CPU over cores x wall, and what each rank's worker thread waited beyond its
            # own main thread's CPU (the core taken by the other rank's threads or by other work), medians
            row["cpu_over_cores_wall"] = float(np.median(
                [sum(g[k][0] for g in run for k in g) for run in threads])) / (cores * med)
            row["worker_wait_beyond_main_s"] = [float(np.median([run[k]["worker"][1] - run[k]["main"][0]
                                                                 for run in threads]))
                                                for k in range(args.ranks)]
        rows.append(row)
        spread = f"{1e3 * min(runs):.0f}-{1e3 * max(runs):.0f}" if runs else ""
        print(f"{dist:<13}{tile:<14}{load['groups']:>4.0f}{bg:>5.1f}{1e3 * f.step_s:>9.1f}{1e3 * f0.step_s:>9.1f}"
              f"{1e3 * fb.step_s:>9.1f}{1e3 * fp.step_s:>7.0f}{1e3 * ff.step_s:>7.1f}{1e3 * fe.step_s:>7.1f}{1e3 * ft.step_s:>7.1f}{1e3 * med:>9.1f}{spread:>17}{100 * err:>7.1f}{100 * err_before:>9.1f}{100 * err_costs:>8.1f}{100 * err_turns:>8.1f}"
              f"{100 * err_deps:>8.1f}{100 * err_speed:>9.1f}{moved if moved is not None else '':>10}{f.bytes_moved:>10}{f.messages:>6}", flush=True)
    load_after = os.getloadavg()[0]
    print(f"load average after: {load_after:.2f}")
    print(json.dumps({"rows": rows, "conditions": conditions, "load_average": [load_before, load_after],
                      "model": MODEL, "batch": BATCH, "seq": SEQ, "sched": args.sched, "progress": args.progress,
                      "main_thread": args.main_thread,
                      "count": args.count, "order": args.order, "speed_checks": speeds, "speed": speed,
                      "network": {"latency_s": net.latency_s, "message_s": net.message_s,
                                  "bandwidth_Bps": net.bandwidth_Bps, "submit_task_s": net.submit_task_s,
                                  "submit_cpu_task_s": net.submit_cpu_task_s, "submit_roles": net.submit_roles,
                                  "protocol_s": net.protocol_s, "submit_share": net.submit_share,
                                  "progress_task_s": net.progress_task_s, "message_cpu_s": net.message_cpu_s,
                                  "eager_bytes": net.eager_limit(), "rndv_bytes": net.rendezvous_limit()}}))


if __name__ == "__main__":
    main()
