"""Where the probe step's time goes on each rank: per-task kernel times and the gaps between a worker's tasks,
measured in the ranks' traces against the rank forecast's.

Runs the probe step of ``tilecast calibrate --ranks`` (:data:`tilecast.loop.ranks_probe.PROBE`) with
``run --ranks`` and forecasts it (:func:`tilecast.loop.ranks_forecast.forecast_ranks`, the stored kernel
calibration and network). Per rank and per kernel, the last step's task times (StarPU's profiling, start to
end of the codelet) beside the one-process calibration's; per rank, the gaps between consecutive tasks of the
worker split by the task after the gap (``recv``: it reads a tile received from the other rank; ``sent``: the
task before it wrote a tile the other rank receives; ``other``), each during the main thread's submission and
after it, measured and forecast. Medians say what a gap costs when nothing is awaited; sums say where the
step went. Per rank, the phases (:func:`phase_table`): the tasks its worker ran while the main thread
submitted, how long after the submission's end the worker began its next task, and after it the span, its
kernels, the mean gap under :data:`WAIT_S` and the waits above it. Needs ``tilecast calibrate`` (kernels) and
``tilecast calibrate --ranks 2`` first.

``--model``, ``--batch``, ``--seq``, ``--tile``, ``--distribution`` and ``--sched`` run another step than the probe
(one of ``mpi_forecast.py``'s rows, say) through the same cuts.

    python3 benchmarks/mpi_probe_costs.py [--runs 1] [--steps 4] [--json FILE] [--distribution data --tile 32,batch=1 ...]
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np


def gap_table(start, end, rank_of, rank, recv, sent, submit_end) -> dict:
    """Gaps between consecutive tasks of ``rank``'s worker (one worker per rank), by class and phase."""
    idx = np.flatnonzero(rank_of == rank)
    idx = idx[np.argsort(start[idx])]
    g = start[idx[1:]] - end[idx[:-1]]
    nxt, prv = idx[1:], idx[:-1]
    cls = np.where(recv[nxt], "recv", np.where(sent[prv], "sent", "other"))
    phase = np.where(start[nxt] < submit_end, "submitting", "after")
    out = {"first_start_s": float(start[idx[0]]), "last_end_s": float(end[idx[-1]]),
           "kernel_s": float((end[idx] - start[idx]).sum()), "gaps_s": float(g.sum()), "tasks": int(len(idx))}
    for ph in ("submitting", "after"):
        for c in ("recv", "sent", "other"):
            sel = (cls == c) & (phase == ph)
            out[f"{ph}.{c}"] = dict(n=int(sel.sum()), sum_s=float(g[sel].sum()),
                                    median_s=float(np.median(g[sel])) if sel.any() else None)
    return out


#: a gap this long or longer after the submission is a wait (for a message, for the other rank), not the runtime's cost
WAIT_S = 20e-6


def phase_table(start, end, rank_of, rank, submit_end) -> dict:
    """``rank``'s worker (one per rank) around its main thread's submission: tasks run while it submitted, the
    delay between the submission's end and the worker's next task (after the last task begun before it), and
    after the submission its span (first task's start to last end), its kernels, the mean of its gaps shorter
    than :data:`WAIT_S` (the runtime's cost per task) and the sum of the longer ones (waits)."""
    idx = np.flatnonzero(rank_of == rank)
    idx = idx[np.argsort(start[idx])]
    during, after = idx[start[idx] < submit_end], idx[start[idx] >= submit_end]
    out = {"during": int(len(during)), "after": int(len(after))}
    if not len(after):
        return out | {"resume_s": None, "span_s": 0.0, "kernel_s": 0.0, "short_gap_mean_s": None, "waits_s": 0.0}
    busy_until = max(submit_end, float(end[during].max())) if len(during) else submit_end
    g = start[after[1:]] - end[after[:-1]]
    short = g < WAIT_S
    return out | {"resume_s": float(start[after[0]] - busy_until),
                  "span_s": float(end[after].max() - start[after[0]]),
                  "kernel_s": float((end[after] - start[after]).sum()),
                  "short_gap_mean_s": float(g[short].mean()) if short.any() else None,
                  "waits_s": float(g[~short].sum())}


def main() -> None:
    from tilecast.executor.mpi_launch import run_mpi
    from tilecast.graph import Tiling
    from tilecast.graph.distribution import prepare
    from tilecast.graph.model_config import load_model
    from tilecast.graph.models import build_step
    from tilecast.graph.owner_computes import plan
    from tilecast.kernels import all_kernels
    from tilecast.loop.predict import stored_models
    from tilecast.loop.ranks_forecast import forecast_ranks, network_or_error, rank_machine_costs
    from tilecast.loop.ranks_probe import PROBE
    from tilecast.loop.ranks_task_cost import received, sent_after
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.kernel_model import DurationModel
    from tilecast.perfmodel.local import conditions_line, run_conditions

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--json", metavar="FILE")
    for key in ("model", "batch", "seq", "tile", "distribution", "sched"):
        ap.add_argument(f"--{key}", type=int if key in ("batch", "seq") else str, default=PROBE[key],
                        help=f"the step to run and cut (default: the probe's, {PROBE[key]})")
    args = ap.parse_args()
    print(conditions_line(run_conditions()))
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    p = {key: getattr(args, key) for key in PROBE}
    cfg, tiling = load_model(p["model"]), Tiling.parse(p["tile"])
    machine = load_machine("local")
    calibration, host_costs = stored_models(machine)
    net = network_or_error(machine, 2, 1)
    built = build_step(cfg, p["batch"], p["seq"], tiling)
    graph, dist = prepare(built, 2, p["distribution"])
    tr = plan(graph, dist.owner, 2).transfers
    # other work as the probe counts it (calibrate --ranks): the background threads leaving the ranks that share
    from tilecast.executor.mpi_threads import progress_drives_worker, runnable_threads
    from tilecast.loop.ranks_load import background_now

    cores = int(machine.meta["hardware"]["cores"])
    bg = background_now(2 * runnable_threads(1, progress_drives_worker(2, 1, cores)), cores)["background"]
    f = forecast_ranks(cfg, p["batch"], p["seq"], tiling, p["sched"], 2, p["distribution"], machine, calibration,
                       host_costs, net, 1, built=built, keep_result=True, background=bg)
    f_old = forecast_ranks(cfg, p["batch"], p["seq"], tiling, p["sched"], 2, p["distribution"], machine,
                           calibration, host_costs, net, 1, built=built, background=bg, task_costs=False)
    m = rank_machine_costs(machine, host_costs, 1, p["sched"])
    cal = DurationModel(m, calibration).durations(graph)[0]
    names = np.array([k.name for k in all_kernels()], dtype=object)[graph.kernel]
    recv = received(tr, graph.n_tasks)
    sim = f.result
    report = {"forecast_step_s": f.step_s, "forecast_before_task_costs_s": f_old.step_s, "background": bg,
              "task_overhead_s": m.task_overhead, "progress_task_s": net.progress_task_s,
              "message_cpu_s": net.message_cpu_s, "runs": []}
    print(f"forecast {1e3 * f.step_s:.1f} ms ({1e3 * f_old.step_s:.1f} without the task costs) with {bg:.1f} threads "
          f"of other work; flat cost per task {1e6 * m.task_overhead:.2f} us, progress round "
          f"{1e6 * (net.progress_task_s or 0.0):.2f} us")
    for i in range(args.runs):
        r = run_mpi(cfg, p["batch"], p["seq"], tiling, p["sched"], 1, args.steps, 2, p["distribution"],
                    timeout_s=900, read_threads=True)
        run = {"step_s": r.median_step_s, "ranks": []}
        print(f"run {i}: step {1e3 * r.median_step_s:.1f} ms (steps {', '.join(f'{1e3 * s:.0f}' for s in r.step_s)})")
        for rank in range(2):
            sub_end = float(r.submit_at_s[rank, -1]) if r.submit_at_s is not None else 0.0
            sim_sub = (sim.summary.get("threads") or {}).get("submit_end_s")
            sim_sub = float(np.atleast_1d(sim_sub)[min(rank, np.size(sim_sub) - 1)]) if sim_sub is not None else 0.0
            sent = sent_after(graph, tr, rank)
            meas = gap_table(r.start_s, r.end_s, r.task_rank, rank, recv, sent, sub_end)
            pred = gap_table(sim.start, sim.end, sim.task_rank, rank, recv, sent, sim_sub)
            mine = np.flatnonzero(r.task_rank == rank)
            d = r.end_s[mine] - r.start_s[mine]
            after = r.start_s[mine] >= sub_end
            kernels = {}
            for k in np.unique(names[mine]):
                s = names[mine] == k
                kernels[k] = dict(n=int(s.sum()), measured_s=float(d[s].sum()), calibrated_s=float(cal[mine][s].sum()),
                                  ratio_after=float(np.median(d[s & after] / cal[mine][s & after]))
                                  if (s & after).any() else None)
            phases = {"measured": phase_table(r.start_s, r.end_s, r.task_rank, rank, sub_end),
                      "predicted": phase_table(sim.start, sim.end, sim.task_rank, rank, sim_sub)}
            row = dict(rank=rank, submit_end_s=sub_end, submit_end_predicted_s=sim_sub, measured=meas,
                       predicted=pred, kernels=kernels, phases=phases, step_s=float(r.rank_step_s[rank, -1]))
            run["ranks"].append(row)
            print(f" rank {rank}: {meas['tasks']} tasks; submission ends {1e3 * sub_end:.1f} ms (pred "
                  f"{1e3 * sim_sub:.1f}); first task {1e3 * meas['first_start_s']:.2f} / {1e3 * pred['first_start_s']:.2f};"
                  f" last end {1e3 * meas['last_end_s']:.1f} / {1e3 * pred['last_end_s']:.1f}; kernels "
                  f"{1e3 * meas['kernel_s']:.1f} / {1e3 * pred['kernel_s']:.1f} (calibrated "
                  f"{1e3 * cal[mine].sum():.1f}); gaps {1e3 * meas['gaps_s']:.1f} / {1e3 * pred['gaps_s']:.1f} ms")
            pm, pp = phases["measured"], phases["predicted"]
            ms = lambda x: f"{1e3 * x:.2f}" if x is not None else "-"
            us = lambda x: f"{1e6 * x:.2f}" if x is not None else "-"
            print(f"   phases: {pm['during']} / {pp['during']} tasks while submitting; next task "
                  f"{ms(pm['resume_s'])} / {ms(pp['resume_s'])} ms after; then span {ms(pm['span_s'])} / "
                  f"{ms(pp['span_s'])} ms: kernels {ms(pm['kernel_s'])} / {ms(pp['kernel_s'])}, gaps under "
                  f"{1e6 * WAIT_S:.0f} us {us(pm['short_gap_mean_s'])} / {us(pp['short_gap_mean_s'])} us each, longer "
                  f"ones {ms(pm['waits_s'])} / {ms(pp['waits_s'])} ms")
            for key in [k for k in meas if "." in k]:
                a, b = meas[key], pred[key]
                med = lambda x: f"{1e6 * x:.1f}" if x is not None else "-"
                print(f"   {key:<18} n {a['n']:>5} / {b['n']:>5}  sum {1e3 * a['sum_s']:7.2f} / {1e3 * b['sum_s']:7.2f} ms"
                      f"  median {med(a['median_s']):>7} / {med(b['median_s']):>7} us")
            for k, v in sorted(kernels.items(), key=lambda kv: -kv[1]["measured_s"])[:8]:
                ra = f"{v['ratio_after']:.2f}" if v["ratio_after"] is not None else "-"
                print(f"   {k:<22} n {v['n']:>5}  {1e3 * v['measured_s']:7.2f} / {1e3 * v['calibrated_s']:7.2f} ms"
                      f"  median ratio after submission {ra}")
        report["runs"].append(run)
        if args.json:  # the raw last step, for other cuts of the same run
            np.savez(f"{os.path.splitext(args.json)[0]}-run{i}.npz", start=r.start_s, end=r.end_s,
                     task_rank=r.task_rank, submit_at=r.submit_at_s if r.submit_at_s is not None else np.zeros(0),
                     sim_start=sim.start, sim_end=sim.end, sim_rank=sim.task_rank, calibrated=cal, recv=recv,
                     kernel=graph.kernel, step_s=np.asarray(r.step_s))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh)


if __name__ == "__main__":
    main()
