"""When each tile message leaves one rank and its reader starts on the other, on one clock.

Runs a step with ``run --ranks 2`` (one worker per rank, both ranks on this host) and puts the ranks' traces
on CLOCK_MONOTONIC (``MPIRunResult.clock_shift_s``: each rank's barrier exit on the shared clock). Per
message of the insert-task model (:func:`tilecast.graph.owner_computes.plan`), times from rank 0's barrier
exit, in ms:

- ``written``: the sending rank's last writer of the tile ends (0: the tile was not written this step);
- ``send``: the sender's main thread inserts the reader task. StarPU-MPI then posts the detached send
  (``_starpu_mpi_exchange_data_before_execution``, ``mpi/src/starpu_mpi_task_insert.c``), which leaves once
  the tile is written (a data acquire), through the progress thread;
- ``recv``: the receiver's main thread inserts the reader task: the detached receive is posted then (same
  function). A message that arrives before it is early data (``_starpu_mpi_receive_early_data``,
  ``mpi/src/mpi/starpu_mpi_mpi.c``), copied when the receive is posted;
- ``local``: the reader's inputs written on its own rank are ready (their last writers ended);
- ``free``: the receiving worker's task before the reader ends;
- ``start``: the reader starts.

``ready`` = max(written, send, recv, local, free); the rest (``start - ready``) is what no submission,
dependency or busy worker explains: the progress loop's polling and the copy. The largest of the five
terms names each message's cause. Figures are printed for the first messages of each direction and summed
over all.

    python3 benchmarks/mpi_handoff.py [--probe | --distribution layer --tile 64,batch=1] [--steps 3] [--npz F]
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from tilecast.loop.ranks_handoff import CAUSES, handoffs, per_reader

MODEL = '{"n_layer":4,"n_embd":128,"n_head":4,"vocab_size":512,"n_positions":128}'  # mpi_forecast.py's


def summary(h: dict, src: int, dst: int, first: int = 8) -> list[str]:
    """``h``: :func:`per_reader`'s."""
    sel = np.flatnonzero((h["src"] == src) & (h["dst"] == dst))
    if not len(sel):
        return [f" {src}->{dst}: no messages"]
    sel = sel[np.argsort(h["start"][sel])]
    ms = lambda x: f"{1e3 * x:8.2f}"  # noqa: E731
    out = [f" {src}->{dst}: {len(sel)} readers; first {min(first, len(sel))} by start (ms on rank 0's clock):",
           "   task  written     send     recv    local     free    ready    start  rest(start-ready)  cause"]
    for k in sel[:first]:
        out.append(f"  {h['task'][k]:5d} {ms(h['written'][k])} {ms(h['send'][k])} {ms(h['recv'][k])} "
                   f"{ms(h['local'][k])} {ms(h['free'][k])} {ms(h['ready'][k])} {ms(h['start'][k])} "
                   f"{ms(h['start'][k] - h['ready'][k])}         {h['cause'][k]}")
    rest = h["start"][sel] - h["ready"][sel]
    causes = ", ".join(f"{c} {int((h['cause'][sel] == c).sum())}" for c in CAUSES)
    # how long after the tile could leave (written and send posted) the receive was posted: early data
    early = h["recv"][sel] - np.maximum(h["written"][sel], h["send"][sel])
    out.append(f"   all: rest median {1e3 * np.median(rest):.3f} ms, p90 {1e3 * np.quantile(rest, 0.9):.3f}, max "
               f"{1e3 * rest.max():.2f}, sum {1e3 * rest.sum():.1f}; cause: {causes}; receive posted after the tile "
               f"could leave (early data) {int((early > 0).sum())} of {len(sel)}, by median "
               f"{1e3 * np.median(early[early > 0]) if (early > 0).any() else 0.0:.2f} ms")
    return out


def idle_line(g: dict) -> str:
    """Per direction: the first reader's wait, and the rest summed over the readers whose worker was idle."""
    out = []
    for s, d in ((0, 1), (1, 0)):
        sel = np.flatnonzero((g["src"] == s) & (g["dst"] == d))
        if not len(sel):
            continue
        k = sel[np.argmin(g["start"][sel])]
        idle = sel[g["cause"][sel] != "free"]
        rest = g["start"][idle] - g["ready"][idle]
        out.append(f"{s}->{d} first reader: written {1e3 * g['written'][k]:.1f}, starts {1e3 * g['start'][k]:.1f} "
                   f"(rest {1e3 * (g['start'][k] - g['ready'][k]):.2f}); {len(idle)} readers waited, rest median "
                   f"{1e3 * np.median(rest):.2f} max {1e3 * rest.max():.2f} sum {1e3 * rest.sum():.1f} ms")
    return "; ".join(out)


def forecast(cfg, batch, seq, tiling, sched, dist_name, graph, tr) -> dict:
    """The rank forecast of the same step, with the other work running now (as mpi_probe_costs.py), and its
    hand-offs (its trace is on one clock; the insertions are not in it: ``send`` and ``recv`` are 0)."""
    from tilecast.executor.mpi_threads import progress_drives_worker, runnable_threads
    from tilecast.loop.predict import stored_models
    from tilecast.loop.ranks_forecast import forecast_ranks, network_or_error
    from tilecast.loop.ranks_load import background_now
    from tilecast.perfmodel import load_machine

    machine = load_machine("local")
    calibration, host_costs = stored_models(machine)
    net = network_or_error(machine, 2, 1)
    cores = int(machine.meta["hardware"]["cores"])
    bg = background_now(2 * runnable_threads(1, progress_drives_worker(2, 1, cores)), cores)["background"]
    f = forecast_ranks(cfg, batch, seq, tiling, sched, 2, dist_name, machine, calibration, host_costs, net, 1,
                       keep_result=True, background=bg)
    sim = f.result
    h = handoffs(graph, tr, sim.task_rank, sim.start, sim.end, np.zeros((2, graph.n_tasks + 1)), np.zeros(2))
    return dict(step_s=f.step_s, background=bg, readers=per_reader(h))


def main() -> None:
    from tilecast.executor.mpi_launch import run_mpi
    from tilecast.graph import Tiling
    from tilecast.graph.distribution import prepare
    from tilecast.graph.model_config import load_model
    from tilecast.graph.models import build_step
    from tilecast.graph.owner_computes import plan
    from tilecast.loop.ranks_probe import PROBE

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe", action="store_true", help="the probe step of calibrate --ranks")
    ap.add_argument("--model", default=MODEL, help="a model name or JSON (default: mpi_forecast.py's)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--tile", default="64,batch=1")
    ap.add_argument("--distribution", default="layer")
    ap.add_argument("--sched", default="lws")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--npz", metavar="FILE")
    ap.add_argument("--forecast", action="store_true", help="the rank forecast's hand-offs beside (needs "
                    "tilecast calibrate and calibrate --ranks 2 in this home)")
    args = ap.parse_args()
    if args.probe:
        p = PROBE
        model, batch, seq, tile, dist_name, sched = (p["model"], p["batch"], p["seq"], p["tile"],
                                                     p["distribution"], p["sched"])
    else:
        model, batch, seq, tile, dist_name, sched = (args.model, args.batch, args.seq, args.tile,
                                                     args.distribution, args.sched)
    print(f"{model} batch {batch} seq {seq} tiling {tile} {dist_name} {sched}, 2 ranks x 1 worker; "
          f"load average before {os.getloadavg()[0]:.2f}")
    cfg, tiling = load_model(model), Tiling.parse(tile)
    graph, dist = prepare(build_step(cfg, batch, seq, tiling), 2, dist_name)
    tr = plan(graph, dist.owner, 2).transfers
    predicted = None
    if args.forecast:
        predicted = forecast(cfg, batch, seq, tiling, sched, dist_name, graph, tr)
    r = run_mpi(cfg, batch, seq, tiling, sched, 1, args.steps, 2, dist_name, timeout_s=900)
    if r.clock_shift_s is None or r.submit_at_s is None:
        raise SystemExit("the ranks' clocks were not recorded (ranks on different hosts?)")
    shift = np.asarray(r.clock_shift_s)
    print(f"steps {', '.join(f'{1e3 * s:.0f}' for s in r.step_s)} ms; rank 1's barrier exit "
          f"{1e3 * shift[1]:+.3f} ms from rank 0's; load average after {os.getloadavg()[0]:.2f}")
    for rank in range(2):
        mine = np.flatnonzero(r.task_rank == rank)
        print(f" rank {rank}: submission {1e3 * (r.submit_at_s[rank, -1] + shift[rank]):.1f} ms, first task "
              f"{1e3 * (np.nanmin(r.start_s[mine]) + shift[rank]):.2f}, last end "
              f"{1e3 * (np.nanmax(r.end_s[mine]) + shift[rank]):.1f} ms ({len(mine)} tasks)")
    h = handoffs(graph, tr, r.task_rank, r.start_s, r.end_s, r.submit_at_s, shift)
    g = per_reader(h) if len(h) else {}
    for s, d in ((0, 1), (1, 0)):
        print("\n".join(summary(g, s, d)) if g else f" {s}->{d}: no messages")
    print(" measured: " + idle_line(g))
    if predicted is not None:
        print(f" forecast ({predicted['step_s'] * 1e3:.1f} ms with {predicted['background']:.1f} threads of other work): "
              + idle_line(predicted["readers"]))
    if args.npz:
        np.savez(args.npz, start=r.start_s, end=r.end_s, task_rank=r.task_rank, submit_at=r.submit_at_s,
                 shift=shift, step_s=np.asarray(r.step_s), **{"h_" + k: v for k, v in h.items()})


if __name__ == "__main__":
    main()
