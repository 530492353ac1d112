"""A probe step run on the ranks: the main thread's submission time per task, and how far the ping-pong's
cost per message falls short inside a step.

``calibrate --ranks`` runs a probe step (:data:`PROBE`: another model, tiling and distribution than
those usually forecast) with ``tilecast run --ranks``. Its runs give the time each rank's main thread
takes per task it submits, in wall time (``submit_task_s``) and in CPU time (``submit_cpu_task_s``,
``time.thread_time``), and, from each insertion's time, its CPU time per task by its role in the task
(``submit_roles``, :mod:`tilecast.simulator.submit_roles`), which the forecast charges on the cores the
main thread shares with the rank's other threads (:mod:`tilecast.simulator.ranks_submission`), and, from the
scheduler's per-thread counts, the main thread's part of its rank's CPU while it submits (``submit_share``,
:func:`tilecast.executor.mpi_threads.submit_share_of`), and, from the runs' traces, what a task and a message
cost the worker that the progress thread runs beyond the one-process model (``progress_task_s``:
:mod:`tilecast.loop.ranks_task_cost`; ``message_cpu_s``: from as many more runs, their MPI calls timed,
:mod:`tilecast.loop.ranks_message_cpu`, else from the gaps' medians). The cost per
message stays the ping-pong's: the probe also reports, by
bisection (:func:`fit_message_cost`), the cost per message at which the rank simulator would predict the
probe's measured step, as a check of the model (``message_s_fitted``), not a value the forecast uses:
a cost fitted on one step stands for whatever the model misses there, and misprices steps of another
shape (a cost fitted on a pipeline step, held per message, made steps of many parallel messages 2-3x
too slow).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

# tile 16: 25,710 tasks, whose submission lasts several time slices (20-40 ms), interleaved with the rank's
# worker as the long submissions it predicts are; at tile 32 (4,370 tasks, 3.5 ms) it fit in one slice and
# cost 0.79 us of CPU per task on a quiet machine, where steps of 22-25 thousand tasks took 0.9-1.4
PROBE = dict(model="gpt2-tiny", batch=4, seq=64, tile="16,batch=1", distribution="layer", sched="lws")


def fit_message_cost(measured_s: float, predict, low: float = 0.0, high: float = 0.1, tol: float = 1e-3) -> float:
    """The cost per message (s) at which ``predict(cost)`` (the simulated step, increasing in the cost) equals
    ``measured_s``; ``low`` if the prediction exceeds it even then, ``high`` if it never reaches it."""
    if predict(low) >= measured_s:
        return low
    if predict(high) <= measured_s:
        return high
    while high - low > tol * max(high, 1e-9):
        mid = 0.5 * (low + high)
        if predict(mid) < measured_s:
            low = mid
        else:
            high = mid
    return 0.5 * (low + high)


def submit_roles_of(results, built, ranks: int, distribution: str, deps: bool = True) -> dict | None:
    """The main threads' CPU time per task by role (:func:`tilecast.simulator.submit_roles.fit_roles`) from the
    insertion times of the runs' last steps, scaled to those steps' CPU time; None when no run timed them or too
    few of a role's insertions kept their core (the forecast then charges ``submit_cpu_task_s`` per task).
    ``deps=False``: no cost per implicit dependency (the earlier rule, kept in the probe's figures)."""
    from tilecast.graph.distribution import prepare
    from tilecast.graph.owner_computes import plan
    from tilecast.simulator.submit_roles import ROLES, fit_roles, role_counts

    timed = [r for r in results if r.submit_at_s is not None]
    if not timed:
        return None
    graph, dist = prepare(built, ranks, distribution)
    p = plan(graph, dist.owner, ranks)
    counts = role_counts(p.task_rank, p.transfers, ranks, graph)
    seconds = np.concatenate([np.diff(r.submit_at_s, axis=1) for r in timed])
    cpu = ([float(r.submit_cpu_s[:, -1].sum()) for r in timed] if all(r.submit_cpu_s is not None for r in timed)
           else None)
    roles = ROLES if deps else tuple(k for k in ROLES if k != "deps")
    counts = counts[..., [ROLES.index(k) for k in roles]]
    try:
        return fit_roles(np.concatenate([counts] * len(timed)), seconds, cpu, roles)
    except ValueError:  # too few insertions timed without losing the core: one CPU time per task, as before
        return None


def task_costs_of(results, built, ranks: int, workers: int, distribution: str, flat_overhead_s: float) -> dict | None:
    """:func:`tilecast.loop.ranks_task_cost.fit_task_costs` on the runs' last steps; None where the progress
    thread did not run the worker (nothing to measure), a rank has several workers, or no run was traced."""
    from tilecast.graph.distribution import prepare
    from tilecast.graph.owner_computes import plan
    from tilecast.loop.ranks_task_cost import fit_task_costs

    traced = [r for r in results if r.progress_drives_worker and r.submit_at_s is not None]
    if workers != 1 or not traced:
        return None
    graph, dist = prepare(built, ranks, distribution)
    transfers = plan(graph, dist.owner, ranks).transfers
    traces = [(r.start_s, r.end_s, r.task_rank, r.submit_at_s[:, -1]) for r in traced]
    return fit_task_costs(traces, graph, transfers, flat_overhead_s)


def message_cpu_of_calls(cfg, tiling, built, ranks: int, workers: int, steps: int, timeout_s: float,
                         repeats: int = 2) -> dict | None:
    """``repeats`` more runs of the probe with their MPI calls timed (:mod:`tilecast.executor.mpi_call_times`) and
    the progress thread's CPU per message fitted on them together
    (:func:`tilecast.loop.ranks_message_cpu.fit_message_cpu`);
    None where the progress thread does not run the worker, a rank has several workers, the interposer cannot be
    built, or the fit has nothing to hold on to."""
    from tilecast.executor.mpi_launch import run_mpi
    from tilecast.graph.distribution import prepare
    from tilecast.graph.owner_computes import plan
    from tilecast.kernels.native_build import NativeUnavailable
    from tilecast.loop.ranks_message_cpu import fit_message_cpu

    p = PROBE
    if workers != 1:
        return None
    try:
        runs = [run_mpi(cfg, p["batch"], p["seq"], tiling, p["sched"], workers, steps, ranks, p["distribution"],
                        timeout_s=timeout_s, mpi_calls=True) for _ in range(repeats)]
    except NativeUnavailable:
        return None
    runs = [r for r in runs if r.progress_drives_worker and r.mpi_calls is not None and r.submit_at_s is not None]
    if not runs:
        return None
    graph, dist = prepare(built, ranks, p["distribution"])
    t = plan(graph, dist.owner, ranks).transfers
    sent = [int(np.sum(np.asarray(t.src) == k)) for k in range(ranks)]
    received = [int(np.sum(np.asarray(t.dst) == k)) for k in range(ranks)]
    got = fit_message_cpu([(r.mpi_calls, r.start_s, r.end_s, r.task_rank, r.submit_at_s[:, -1], sent, received)
                           for r in runs], float(np.mean([r.mpi_call_cost_s for r in runs])))
    return {**got, "runs": len(runs)} if got else None


def probe_network(net, ranks: int, workers: int, steps: int = 4, repeats: int = 2, timeout_s: float = 900.0):
    """(``net`` with ``message_s`` fitted on the probe step, the probe's figures). Runs the probe ``repeats``
    times on ``ranks`` ranks; the step time is the median of the runs' medians."""
    from tilecast.executor.mpi_launch import run_mpi
    from tilecast.executor.mpi_threads import runnable_others
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model
    from tilecast.graph.models import build_step
    from tilecast.loop.predict import stored_models
    from tilecast.perfmodel import load_machine
    from tilecast.loop.ranks_forecast import forecast_ranks, rank_machine_costs

    p = PROBE
    cfg, tiling = load_model(p["model"]), Tiling.parse(p["tile"])
    from tilecast.executor.mpi_threads import progress_drives_worker, runnable_threads
    from tilecast.loop.ranks_load import background_now

    cores = load_machine("local").meta.get("hardware", {}).get("cores") or 0
    ours = ranks * runnable_threads(workers, bool(cores) and progress_drives_worker(ranks, workers, cores))
    # other work on the machine, as the background threads giving the ranks the same share of the cores
    background = background_now(ours, int(cores))["background"] if cores else runnable_others()
    results = [run_mpi(cfg, p["batch"], p["seq"], tiling, p["sched"], workers, steps, ranks, p["distribution"],
                       timeout_s=timeout_s, read_threads=True) for _ in range(repeats)]
    runs = [r.median_step_s for r in results]
    measured = float(np.median(runs))
    # the main thread's time per task it submits: each rank's median over the steps after the first
    submit = [float(np.median(r.submit_s[:, 1:] if r.submit_s.shape[1] > 1 else r.submit_s)) / r.n_tasks
              for r in results if r.submit_s is not None]
    # and its CPU time per task (time.thread_time): what it asks of the cores it shares, which the forecast
    # charges on them (tilecast.simulator.ranks_submission); the wall time above already holds the waits
    cpu = [float(np.median(r.submit_cpu_s[:, 1:] if r.submit_cpu_s.shape[1] > 1 else r.submit_cpu_s)) / r.n_tasks
           for r in results if r.submit_cpu_s is not None]
    built = build_step(cfg, p["batch"], p["seq"], tiling)
    roles = submit_roles_of(results, built, ranks, p["distribution"])
    roles_no_deps = submit_roles_of(results, built, ranks, p["distribution"], deps=False)
    # how the rank's slots split between the main thread and the worker thread it shares them with while it
    # submits: the scheduler's per-thread counts over the submission (Linux's fair share is half each)
    from tilecast.executor.mpi_threads import submit_share_of

    share = submit_share_of(results)
    machine = load_machine("local")
    calibration, host_costs = stored_models(machine)
    # the worker's round of StarPU-MPI's progress loop per task and its CPU per message, from the runs' traces
    costs = task_costs_of(results, built, ranks, workers, p["distribution"],
                          rank_machine_costs(machine, host_costs, workers, p["sched"]).task_overhead)
    # and per message from the MPI calls' own times, in runs of their own (timing them slows the step); the gaps'
    # medians above where they cannot be timed
    calls = message_cpu_of_calls(cfg, tiling, built, ranks, workers, steps, timeout_s, repeats)
    message_cpu = calls["message_cpu_s"] if calls else (costs["message_cpu_s"] if costs else None)
    net = replace(net, submit_task_s=float(np.median(submit)) if submit else 0.0,
                  submit_cpu_task_s=float(np.median(cpu)) if cpu else 0.0, submit_roles=roles, submit_share=share,
                  progress_task_s=costs["progress_task_s"] if costs else None, message_cpu_s=message_cpu)

    def predict(cost: float) -> float:
        trial = replace(net, message_s=cost)
        return forecast_ranks(cfg, p["batch"], p["seq"], tiling, p["sched"], ranks, p["distribution"], machine,
                              calibration, host_costs, trial, workers, built=built,
                              background=background).step_s

    cost = fit_message_cost(measured, predict, low=net.message_s)
    probe = {**p, "ranks": ranks, "workers_per_rank": workers, "steps": steps, "runs_s": runs,
             "step_s": measured, "predicted_with_pingpong_s": predict(net.message_s),
             "message_s_pingpong": net.message_s, "message_s_fitted": cost, "submit_task_s": net.submit_task_s,
             "submit_cpu_task_s": net.submit_cpu_task_s, "submit_roles": roles, "submit_roles_no_deps": roles_no_deps,
             "submit_share": share, "progress_task_s": net.progress_task_s, "message_cpu_s": net.message_cpu_s,
             "message_cpu_from": "mpi calls" if calls else ("gap medians" if costs else None),
             "message_cpu_gap_medians_s": costs["message_cpu_s"] if costs else None, "message_cpu_calls": calls,
             "task_gap_mean_s": costs["gap_mean_s"] if costs else None,
             "flat_task_overhead_s": costs["flat_overhead_s"] if costs else None,
             "background_threads": background}
    src = (f"{net.source}; submission per task measured on a probe step ({p['model']}, batch {p['batch']} x "
           f"{p['seq']}, tiling {p['tile']}, {p['distribution']}, {p['sched']}: median {measured * 1e3:.0f} ms "
           f"over {repeats} runs)")
    return replace(net, source=src, probe=probe), probe
