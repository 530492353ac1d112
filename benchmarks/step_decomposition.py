"""Where one configuration's step goes, measured and predicted: before the graph, the graph, after it.

Runs a configuration on StarPU (``--steps`` timed steps after ``--warmup``, every
step traced, or with ``--untraced`` none, as the probes of ``tilecast calibrate``
time theirs; a trace is built after the step's end and is not part of it) and
splits each measured step at the executor's own marks:

- ``batch``: from the step's start to the new batch written (``set_batch``);
- ``prepare``: from there to the call that submits the graph (the graph's
  arrays, priorities, tile handles);
- ``to_origin``: from that call to the makespan's origin (StarPU's workers
  resumed; the submitting thread may then wait for a core);
- ``to_first``: from the origin to the first task's start (the submitting
  thread's first tasks, a worker waking);
- ``graph``: the first task's start to the last task's end (what a simulation
  of the task graph covers, less its first start);
- ``after``: the last task's end to the step's end (waking the waiting thread,
  pausing the workers, StarPU's wait for the tasks' termination).

The measured makespan (what ``tilecast run`` records, from the origin, just
before the first task is submitted, to the last task's end) is ``to_first +
graph``; the host cost the models fit is the step less that: ``batch + prepare +
to_origin + after``. The same configuration
predicted from the models stored under ``$TILECAST_HOME`` (``tilecast.loop.predict``)
gives the simulated makespan, its first task's start, and the host cost added
to it. Per worker, the traced graph time is split into busy and idle.

Needs StarPU and a calibration (``tilecast calibrate``). Prints a table, then
one JSON line (medians over the timed steps, in ms).

    python3 benchmarks/step_decomposition.py [--model gpt2-tiny] [--batch 32] [--seq 128] [--tile 64]
        [--sched eager] [--workers 2] [--steps 10] [--warmup 3] [--untraced]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from types import SimpleNamespace

import numpy as np


class _Marks:
    """A stand-in for the glue's library that notes when the graph is submitted (the rest passes through)."""

    def __init__(self, lib):
        self._lib = lib
        self.submit_called = self.submit_returned = self.origin = None

    def tcs_submit(self, *args):
        self.submit_called = time.perf_counter()
        out = self._lib.tcs_submit(*args)
        self.submit_returned = time.perf_counter()
        return out

    def tcs_finish(self):
        wall = self._lib.tcs_finish()  # seconds since the makespan's origin (StarPU's clock: CLOCK_MONOTONIC)
        self.origin = time.perf_counter() - wall  # that origin on perf_counter's clock (the same clock)
        return wall

    def __getattr__(self, name):
        return getattr(self._lib, name)


def measure(cfg, batch, seq, tiling, sched, workers, steps, warmup, traced: bool = True,
            idle_s: float = 0.0) -> list[dict]:
    """Per timed step, its parts (seconds) as the module docstring splits them; without ``traced`` no step
    builds a trace, and the parts that need one (``to_first``, ``graph``, ``busy``) are NaN."""
    from tilecast.executor import starpu_execute
    from tilecast.executor.starpu_run import StarPUTraining
    from tilecast.executor.starpu_session import StarPUSession
    from tilecast.graph.models import build_step
    from tilecast.reference.step import TrainState, init_params, set_batch

    graph = build_step(cfg, batch, seq, tiling)
    data = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(steps + warmup + 1, batch, seq + 1))
    real_glue = starpu_execute.glue
    marks = _Marks(real_glue().lib)
    starpu_execute.glue = lambda: SimpleNamespace(lib=marks, ffi=real_glue().ffi)
    out = []
    try:
        with StarPUSession(sched, workers) as session:
            training = StarPUTraining(session, graph, TrainState(init_params(cfg, 0)), data)
            training.step(trace=False)  # the first step's batch is the loaded one
            for t in range(1, steps + warmup + 1):
                if idle_s > 0:
                    time.sleep(idle_s)  # the host busy elsewhere between steps, the workers paused
                t0 = time.perf_counter()
                set_batch(graph, training.store, data[t, :, :-1], data[t, :, 1:], t + 1)
                t1 = time.perf_counter()
                trace = session.execute(graph, training.store, trace=traced)
                step_s = session.tasks_done_at - t0
                if t <= warmup:
                    continue
                last = session.last_makespan_s
                if trace is not None:
                    first = float(trace["start_s"].min())
                    busy = trace.assign(d=trace["end_s"] - trace["start_s"]).groupby("worker")["d"].sum()
                else:
                    first, busy = float("nan"), np.array([float("nan")])
                out.append({"step": step_s, "batch": t1 - t0, "prepare": marks.submit_called - t1,
                            "to_first": first, "graph": last - first,
                            "to_origin": marks.origin - marks.submit_called,
                            "after": session.tasks_done_at - marks.origin - last,
                            "makespan": last, "submit": session.last_submit_s,
                            "submit_call": marks.submit_returned - marks.submit_called,
                            "loop_to_return": marks.submit_returned - marks.origin - session.last_submit_s,
                            "busy": float(busy.sum())})
    finally:
        starpu_execute.glue = real_glue
    return out


def predicted(cfg, batch, seq, tiling, sched, workers) -> dict:
    """The stored models' prediction of the configuration: makespan, first start, host cost (seconds)."""
    from tilecast.loop.config import StepConfig
    from tilecast.loop.predict import predict, stored_models
    from tilecast.perfmodel import load_machine

    machine = load_machine("local")
    cal, host = stored_models(machine)
    if cal is None:
        sys.exit("step_decomposition: no stored calibration under $TILECAST_HOME (run `tilecast calibrate`)")
    p = predict(StepConfig(cfg, batch, seq, tiling, sched, workers), machine, cal, host, keep_result=True)
    tr = p.result.trace()
    return {"step": p.step_s, "makespan": p.makespan_s, "host": p.host_s, "to_first": float(tr["start_s"].min()),
            "graph": p.makespan_s - float(tr["start_s"].min()),
            "busy": float((tr["end_s"] - tr["start_s"]).sum()), "host_source": p.host_source}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt2-tiny")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--tile", default="64")
    ap.add_argument("--sched", default="eager")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--idle-ms", type=float, default=0.0,
                    help="milliseconds the host sleeps between steps, the workers paused (default 0)")
    ap.add_argument("--untraced", action="store_true",
                    help="build no step's trace (as the probes' timed steps): step, makespan and host only")
    args = ap.parse_args()
    for flag in ("batch", "seq", "workers", "steps"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag}: at least 1, got {getattr(args, flag)}")
    if not args.idle_ms >= 0:
        ap.error(f"--idle-ms: at least 0, got {args.idle_ms}")
    if args.warmup < 0:
        ap.error(f"--warmup: at least 0, got {args.warmup}")
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model
    from tilecast.perfmodel.local import conditions_line, run_conditions

    conditions = run_conditions()
    print(conditions_line(conditions))
    cfg, tiling = load_model(args.model), Tiling.parse(args.tile)
    load_before = os.getloadavg()[0]
    rows = measure(cfg, args.batch, args.seq, tiling, args.sched, args.workers, args.steps, args.warmup,
                   traced=not args.untraced, idle_s=args.idle_ms / 1e3)
    load_after = os.getloadavg()[0]
    med = {k: float(np.median([r[k] for r in rows])) * 1e3 for k in rows[0]}
    pred = predicted(cfg, args.batch, args.seq, tiling, args.sched, args.workers)
    host_measured = med["batch"] + med["prepare"] + med["to_origin"] + med["after"]
    print(f"{args.model} {args.batch}x{args.seq} tile {args.tile} {args.sched}, {args.workers} workers; medians of "
          f"{len(rows)} steps (ms), {'none' if args.untraced else 'every one'} traced; load average {load_before:.1f} before, {load_after:.1f} after")
    print(f"{'':<28}{'measured':>10}{'predicted':>10}")
    print(f"{'step':<28}{med['step']:>10.3f}{pred['step'] * 1e3:>10.3f}")
    print(f"{'  batch written':<28}{med['batch']:>10.3f}")
    print(f"{'  prepare (to submit call)':<28}{med['prepare']:>10.3f}")
    print(f"{'  submit call to origin':<28}{med['to_origin']:>10.3f}")
    print(f"{'  origin to 1st task':<28}{med['to_first']:>10.3f}{pred['to_first'] * 1e3:>10.3f}")
    print(f"{'  1st task to last end':<28}{med['graph']:>10.3f}{pred['graph'] * 1e3:>10.3f}")
    print(f"{'  last end to step end':<28}{med['after']:>10.3f}")
    print(f"{'makespan':<28}{med['makespan']:>10.3f}{pred['makespan'] * 1e3:>10.3f}")
    print(f"{'host (step - makespan)':<28}{host_measured:>10.3f}{pred['host'] * 1e3:>10.3f}")
    print(f"{'submission (C loop)':<28}{med['submit']:>10.3f}")
    print(f"{'submit call, in all':<28}{med['submit_call']:>10.3f}")
    print(f"{'  loop end to call return':<28}{med['loop_to_return']:>10.3f}")
    print(f"{'worker busy, all workers':<28}{med['busy']:>10.3f}{pred['busy'] * 1e3:>10.3f}")
    print(json.dumps({"measured_ms": med, "host_measured_ms": host_measured,
                      "predicted_ms": {k: v * 1e3 for k, v in pred.items() if k != "host_source"},
                      "host_source": pred["host_source"], "steps": len(rows), "traced": not args.untraced,
                      "load_average": [load_before, load_after], "conditions": conditions}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
