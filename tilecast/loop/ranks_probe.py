"""What a message costs inside a step, fitted on a probe step run on the ranks.

A ping-pong times messages one at a time. Inside a step StarPU-MPI's
progress thread polls for the whole step beside a busy worker on every rank,
and where the machine has fewer cores than runnable threads a message waits
for the operating system to give that thread a time slice (milliseconds, not
the microseconds of the ping-pong). ``calibrate --ranks`` therefore also runs
a probe step (:data:`PROBE`: another model, tiling and distribution than
those usually forecast) with ``tilecast run --ranks`` and finds, by
bisection, the cost per message at which the rank simulator predicts the
probe's measured step time (:func:`fit_message_cost`); that cost, not the
ping-pong's, is what the forecast charges per message when it is larger. The probe's runs also give
the time each rank's main thread takes per task it submits (``submit_task_s``), which the forecast
charges as the order in which tasks join their rank's queues.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

PROBE = dict(model="gpt2-tiny", batch=4, seq=64, tile="32,batch=1", distribution="layer", sched="lws")


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
    from tilecast.loop.ranks_forecast import forecast_ranks

    p = PROBE
    cfg, tiling = load_model(p["model"]), Tiling.parse(p["tile"])
    background = runnable_others()  # other work on the machine, modelled as threads sharing its cores
    results = [run_mpi(cfg, p["batch"], p["seq"], tiling, p["sched"], workers, steps, ranks, p["distribution"],
                       timeout_s=timeout_s) for _ in range(repeats)]
    runs = [r.median_step_s for r in results]
    measured = float(np.median(runs))
    # the main thread's time per task it submits: each rank's median over the steps after the first
    submit = [float(np.median(r.submit_s[:, 1:] if r.submit_s.shape[1] > 1 else r.submit_s)) / r.n_tasks
              for r in results if r.submit_s is not None]
    net = replace(net, submit_task_s=float(np.median(submit)) if submit else 0.0)
    machine = load_machine("local")
    calibration, host_costs = stored_models(machine)
    built = build_step(cfg, p["batch"], p["seq"], tiling)

    def predict(cost: float) -> float:
        trial = replace(net, message_s=cost)
        return forecast_ranks(cfg, p["batch"], p["seq"], tiling, p["sched"], ranks, p["distribution"], machine,
                              calibration, host_costs, trial, workers, built=built,
                              background=background).step_s

    cost = fit_message_cost(measured, predict, low=net.message_s)
    probe = {**p, "ranks": ranks, "workers_per_rank": workers, "steps": steps, "runs_s": runs,
             "step_s": measured, "predicted_with_pingpong_s": predict(net.message_s),
             "message_s_pingpong": net.message_s, "message_s_fitted": cost, "submit_task_s": net.submit_task_s,
             "background_threads": background}
    src = (f"{net.source}; cost per message fitted on a probe step ({p['model']}, batch {p['batch']} x "
           f"{p['seq']}, tiling {p['tile']}, {p['distribution']}, {p['sched']}: median {measured * 1e3:.0f} ms "
           f"over {repeats} runs)")
    return replace(net, message_s=cost, source=src, probe=probe), probe
