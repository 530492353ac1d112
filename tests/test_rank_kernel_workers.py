"""The ranks' kernels timed with every rank's workers busy on the machine, not one rank's alone."""

from dataclasses import replace

import numpy as np
import pytest

from tests.test_rank_simulator import cpu_machine
from tilecast.graph import Tiling
from tilecast.graph.model_config import load_model
from tilecast.loop.ranks_forecast import forecast_ranks, kernel_workers
from tilecast.perfmodel.network import Network

MODEL = '{"n_layer":1,"n_embd":64,"n_head":2,"vocab_size":128,"n_positions":64}'


def test_busy_workers_are_the_ranks_together_up_to_the_machines():
    two = cpu_machine(2)
    assert kernel_workers(two, 2, 1) == 2  # run --ranks 2 on 2 cores: both busy through the step
    assert kernel_workers(two, 1, 1) == 1
    assert kernel_workers(two, 4, 1) == 2  # 4 ranks sharing 2 cores: the machine's 2
    assert kernel_workers(cpu_machine(4), 2, 2) == 4


def test_the_forecast_takes_its_kernels_at_the_machines_busy_workers(monkeypatch):
    import tilecast.perfmodel.kernel_model as km

    seen = []
    real = km.DurationModel.durations

    def durations(self, graph):
        seen.append(len(self.machine.workers))
        return real(self, graph)

    monkeypatch.setattr(km.DurationModel, "durations", durations)
    m = cpu_machine(2)
    m = replace(m, meta={**m.meta, "hardware": {"cores": 2}})
    net = Network(latency_s=1e-6, bandwidth_Bps=1e10, message_s=1e-5)
    cfg = load_model(MODEL)

    def step(**kw):
        return forecast_ranks(cfg, 2, 32, Tiling.parse("32,batch=1"), "lws", 2, "data", m, None, None, net, **kw)

    both, own = step(), step(machine_workers=False)
    assert seen == [2, 1]
    # without a calibration the roofline does not depend on the workers busy: the same step either way
    assert both.step_s == pytest.approx(own.step_s) and np.isfinite(both.step_s)
