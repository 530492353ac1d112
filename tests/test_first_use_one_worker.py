"""A step on one worker forecast from calibration alone (empty home), against the same step run on StarPU.

Calibration keeps every worker busy; a step on one worker gets the kernels' one-worker factor, timed hot on
one worker and on all side by side (tilecast.loop.kernel_calibration.worker_pair_passes). Timed cold against
the main passes instead, it scaled one-worker durations by 0.6-0.9 and made such steps 4-16% fast
(docs/predicting.md). The durations are compared, summed over the step's tasks: the cost between tasks is
not calibrated here (no probe steps), so the makespan would test the machine description's, not this.
"""

import time

import numpy as np
import pytest

from tilecast.graph import Tiling
from tilecast.graph.model_config import load_model
from tilecast.graph.models import build_step

# the predicted sum of a one-worker step's task durations over the fastest traced step's (a loaded machine
# preempts the measured steps and slows calibration alike; the fastest of several steps is the least disturbed).
# Measured on the 2-core Xeon, loaded by other work (load average 8): 3.03 ms predicted against 3.11 ms (0.98);
# with format 4's factor, 2.77 ms against 3.11-3.36 ms in two runs (0.82-0.89). On the 2-core AMD EPYC
# (2026-12-01), ten runs of this test: 0.74-1.09, the low ones when every traced step of a run came out slow
# together (3.7-4.8 ms against 3.1 ms minutes before) while calibration, timed hot, stayed at 3.0-3.2 ms:
# the machine is a shared VM, and the cause was not established (calibration's passes run hot, the step's
# tiles come from memory, which another tenant's traffic would slow the more). Up to RUNS runs of the
# step are therefore taken, apart, and the fastest step of all is compared; even so, a slow phase outlasted
# three runs 5 s apart once in five (0.84 over 18 steps), hence the lower bound: it still fails on the fault
# this test was written for (one-worker durations scaled by 0.6).
LOW, HIGH = 0.75, 1.6
RUNS = 3


def test_one_worker_durations_forecast_from_calibration_alone(tmp_path, monkeypatch):
    from tilecast.executor.starpu_run import run_steps
    from tilecast.loop.kernel_calibration import ensure_calibration, starpu_workers
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.kernel_model import DurationModel

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    machine = load_machine("local")
    workers = starpu_workers(machine)
    if not workers or workers < 2:
        pytest.skip(f"needs StarPU with 2 workers to calibrate a one-worker factor (here: {workers})")
    cfg, batch, seq, tiling = load_model("gpt2-tiny"), 4, 64, Tiling.parse("64")
    graph = build_step(cfg, batch, seq, tiling)
    cal = ensure_calibration(machine, [graph], progress=False)
    assert cal.lane_workers == workers and cal.worker_samples  # the factor was measured
    predicted = DurationModel(machine.with_workers(1), cal).durations(graph)[0].sum()
    sums = []
    for attempt in range(RUNS):
        if attempt:
            time.sleep(5.0)  # apart, so that one slow phase of the machine is not sampled three times
        run = run_steps(cfg, batch, seq, tiling, "eager", 1, 8, trace_from=2)
        sums += [float((t[t["task"] >= 0]["end_s"] - t[t["task"] >= 0]["start_s"]).sum()) for t in run.traces]
        ratio = predicted / min(sums)
        print(f"one worker: predicted task time {predicted * 1e3:.2f} ms, traced {np.round(np.asarray(sums) * 1e3, 2)}"
              f" ms, ratio to the fastest {ratio:.2f}")
        if LOW <= ratio <= HIGH:
            break
    assert LOW <= ratio <= HIGH, f"predicted {predicted * 1e3:.2f} ms against {min(sums) * 1e3:.2f} ms measured"
