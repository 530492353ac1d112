"""Where tilecast's and SimGrid's makespans part: the same steps, each simulator fed the other's durations.

Reads what ``vs_starpu_simgrid.py`` stored for ``--reuse`` (the learning
pass's StarPU histories, the measured steps with their traces) and the models
stored under ``$TILECAST_HOME``; runs nothing on StarPU. Per configuration:

- makespans: measured (median), tilecast (its own durations), tilecast's
  simulator fed StarPU's per-footprint history means (what SimGrid executes:
  kernel and total bytes, rows of one size pooled by their sample counts),
  tilecast's simulator fed each task's own measured duration (mean over the
  traced steps), and SimGrid;
- the work (sum of the task durations) each of them runs;
- per worker: tasks run and time not in a task (makespan - busy), measured
  (median over the traced steps), tilecast's timeline and SimGrid's.

If tilecast fed the history means lands where SimGrid does, the gap is in
tilecast's durations; if not, in its model of the runtime between tasks.

``--starpu-home DIR`` takes SimGrid's histories from another STARPU_HOME
and leaves the measured figures out (no stored run needed): the two
simulators side by side alone.

    python3 benchmarks/simgrid_gap.py [--suite quick|default] [--starpu-home DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def history_durations(graph, starpu_dir: Path) -> np.ndarray:
    """(1, n_tasks): each task's StarPU history mean for its kernel and total bytes (NaN where none)."""
    from tilecast.kernels import all_kernels
    from tilecast.perfmodel.starpu_history import CPU_DEVICE, history_files, read_history

    files = history_files(str(starpu_dir / ".starpu" / "sampling" / "codelets"))
    per_task = np.add.reduceat(graph.tile_nbytes[graph.acc_tile].astype(np.int64), graph.acc_ptr[:-1])
    out = np.full(graph.n_tasks, np.nan)
    for k in np.unique(graph.kernel):
        name = all_kernels()[k].name
        if name not in files:
            continue
        pooled: dict = {}
        for r in read_history(files[name]):
            if r.device == CPU_DEVICE and r.n > 0:
                n, s = pooled.get(r.size, (0, 0.0))
                pooled[r.size] = (n + r.n, s + r.n * r.mean_s)
        idx = np.flatnonzero(graph.kernel == k)
        out[idx] = [pooled[b][1] / pooled[b][0] if b in pooled else np.nan for b in per_task[idx]]
    return out[None, :]


def measured_durations(graph, traces) -> np.ndarray:
    """(1, n_tasks): each task's mean measured duration over the traced steps."""
    from tilecast.perfmodel.from_trace import task_seconds

    return np.nanmean([task_seconds(graph, t) for t in traces], axis=0)[None, :]


def trace_workers(graph, trace, workers: int) -> tuple:
    """(makespan from the trace's origin, tasks per worker, time not in a task per worker) of one real trace."""
    t = trace[(trace["task"] >= 0)]
    w = t["worker"].to_numpy()
    span = float(t["end_s"].max())
    busy = np.bincount(w, weights=(t["end_s"] - t["start_s"]).to_numpy(), minlength=workers)
    return span, np.bincount(w, minlength=workers), span - busy


def sim_workers(res, workers: int) -> tuple:
    busy = np.bincount(res.worker, weights=res.end - res.start, minlength=workers)
    return np.bincount(res.worker, minlength=workers), res.makespan - busy


def side_by_side(c, machine, cal, host, starpu_dir, exe, rows) -> None:
    """The two simulators alone (no measured step): makespans, work, per-worker tasks and idle time."""
    from tilecast.executor.simgrid_replay import simgrid_makespans
    from tilecast.loop.predict import predict
    from tilecast.perfmodel.kernel_model import DurationModel

    g = c.build()
    own = predict(c, machine, cal, host, graph=g, keep_result=True)
    tc_d = DurationModel(machine.with_workers(c.workers), cal).durations(g)
    hist_d = history_durations(g, starpu_dir)
    fed = predict(c, machine, cal, host, graph=g, durations=hist_d, keep_result=True)
    sg = simgrid_makespans(g, c.sched, c.workers, starpu_dir, exe=exe)
    row = {"config": c.label(), "tasks": int(g.n_tasks),
           "makespan_s": {"tilecast": own.makespan_s, "tilecast_history_durations": fed.makespan_s,
                          "simgrid": sg.makespan_s},
           "work_s": {"tilecast": float(tc_d[0].sum()), "tilecast_timeline": float((own.result.end
                                                                                    - own.result.start).sum()),
                      "history": float(np.nansum(hist_d)), "simgrid": float(sum(sg.worker_busy_s))},
           "worker_tasks": {"tilecast": sim_workers(own.result, c.workers)[0].tolist(),
                            "tilecast_history_durations": sim_workers(fed.result, c.workers)[0].tolist(),
                            "simgrid": sg.worker_tasks},
           "worker_idle_s": {"tilecast": sim_workers(own.result, c.workers)[1].tolist(),
                             "tilecast_history_durations": sim_workers(fed.result, c.workers)[1].tolist(),
                             "simgrid": (sg.makespan_s - np.asarray(sg.worker_busy_s)).tolist()},
           "history_missing": int(np.isnan(hist_d).sum())}
    rows.append(row)
    mk, wk = row["makespan_s"], row["work_s"]
    print(f"\n{c.label()}  ({g.n_tasks} tasks)")
    print(f"  makespan  tilecast {mk['tilecast'] * 1e3:.2f} ms  tilecast+history means "
          f"{mk['tilecast_history_durations'] * 1e3:.2f} ms  SimGrid {mk['simgrid'] * 1e3:.2f} ms")
    print(f"  work      tilecast {wk['tilecast'] * 1e3:.2f} (timeline {wk['tilecast_timeline'] * 1e3:.2f})  "
          f"history means {wk['history'] * 1e3:.2f}  SimGrid {wk['simgrid'] * 1e3:.2f}  "
          f"(missing history: {row['history_missing']})")
    for k in ("tilecast", "tilecast_history_durations", "simgrid"):
        print(f"  {k:<28} tasks {row['worker_tasks'][k]}  idle ms "
              f"{[round(x * 1e3, 2) for x in row['worker_idle_s'][k]]}")


def main() -> int:
    import vs_starpu_simgrid as bench

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", choices=sorted(bench.SUITES), default="default")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--starpu-home", metavar="DIR",
                    help="SimGrid's histories from this STARPU_HOME; no measured figures (default: the stored run's)")
    args = ap.parse_args()

    from tilecast.executor.simgrid_build import ensure_replay
    from tilecast.executor.simgrid_replay import simgrid_makespans
    from tilecast.executor.starpu_session import default_workers
    from tilecast.loop.predict import predict, stored_models
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.kernel_model import DurationModel

    store = bench.reuse_dir(args.suite)
    workers = args.workers or default_workers()
    cfgs = bench.configs(args.suite, workers)
    measured = bench.load_measured(store, cfgs) if not args.starpu_home else [None] * len(cfgs)
    starpu_dir = Path(args.starpu_home) if args.starpu_home else store / "starpu"
    machine = load_machine("local")
    cal, host = stored_models(machine)
    exe = ensure_replay()
    rows = []
    for c, m in zip(cfgs, measured):
        if m is None:
            side_by_side(c, machine, cal, host, starpu_dir, exe, rows)
            continue
        g = m.graph
        traces = m.traces or [m.trace]
        own = predict(c, machine, cal, host, graph=g, keep_result=True)
        tc_d = DurationModel(machine.with_workers(c.workers), cal).durations(g)
        hist_d = history_durations(g, starpu_dir)
        meas_d = measured_durations(g, traces)
        fed_hist = predict(c, machine, cal, host, graph=g, durations=hist_d, keep_result=True)
        fed_meas = predict(c, machine, cal, host, graph=g, durations=np.where(np.isnan(meas_d), tc_d, meas_d),
                           keep_result=True)
        sg = simgrid_makespans(g, c.sched, c.workers, starpu_dir, exe=exe)
        real = [trace_workers(g, t, c.workers) for t in traces]
        tasks_real = np.median([r[1] for r in real], axis=0)
        idle_real = np.median([r[2] for r in real], axis=0)
        tasks_tc, idle_tc = sim_workers(own.result, c.workers)
        tasks_fh, idle_fh = sim_workers(fed_hist.result, c.workers)
        row = {
            "config": c.label(), "tasks": int(g.n_tasks),
            "makespan_s": {"real": m.makespan_s, "real_traced": float(np.median([r[0] for r in real])),
                           "tilecast": own.makespan_s, "tilecast_history_durations": fed_hist.makespan_s,
                           "tilecast_measured_durations": fed_meas.makespan_s, "simgrid": sg.makespan_s},
            "work_s": {"real_traced": float(np.nanmean([np.nansum(d) for d in
                                                         (measured_durations(g, [t]) for t in traces)])),
                       "tilecast": float(tc_d[0].sum()),
                       "tilecast_timeline": float((own.result.end - own.result.start).sum()),
                       "history": float(np.nansum(hist_d)), "simgrid": float(sum(sg.worker_busy_s))},
            "history_missing": int(np.isnan(hist_d).sum()),
            "worker_tasks": {"real": tasks_real.tolist(), "tilecast": tasks_tc.tolist(),
                             "tilecast_history_durations": tasks_fh.tolist(), "simgrid": sg.worker_tasks},
            "worker_idle_s": {"real": idle_real.tolist(), "tilecast": idle_tc.tolist(),
                              "tilecast_history_durations": idle_fh.tolist(),
                              "simgrid": (sg.makespan_s - np.asarray(sg.worker_busy_s)).tolist()},
            "host_s": {"real": m.host_s, "tilecast": own.host_s},
            "task_overhead_s": own.task_overhead_s,
        }
        rows.append(row)
        mk, wk = row["makespan_s"], row["work_s"]
        r0 = mk["real"]
        print(f"\n{c.label()}  ({g.n_tasks} tasks)")
        print(f"  makespan  real {r0 * 1e3:.2f} ms (traced steps {mk['real_traced'] * 1e3:.2f})  "
              f"tilecast {mk['tilecast'] / r0 - 1:+.1%}  tilecast+history means "
              f"{mk['tilecast_history_durations'] / r0 - 1:+.1%}  tilecast+measured durations "
              f"{mk['tilecast_measured_durations'] / r0 - 1:+.1%}  SimGrid {mk['simgrid'] / r0 - 1:+.1%}")
        print(f"  work      real {wk['real_traced'] * 1e3:.2f} ms  tilecast {wk['tilecast'] * 1e3:.2f} "
              f"(timeline {wk['tilecast_timeline'] * 1e3:.2f})  history means {wk['history'] * 1e3:.2f}  "
              f"SimGrid {wk['simgrid'] * 1e3:.2f}  (missing history: {row['history_missing']})")
        for k in ("real", "tilecast", "tilecast_history_durations", "simgrid"):
            print(f"  {k:<28} tasks {row['worker_tasks'][k]}  idle ms "
                  f"{[round(x * 1e3, 2) for x in row['worker_idle_s'][k]]}")
        print(f"  host: real {m.host_s * 1e3:.2f} ms, tilecast {own.host_s * 1e3:.2f} ms; cost per task charged "
              f"{own.task_overhead_s * 1e6:.2f} us")
    print(json.dumps({"suite": args.suite, "workers": workers, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
