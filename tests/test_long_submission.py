"""The submitting thread's cost per task taken from the probe with the most tasks
(tilecast.loop.host_cost.long_submission_per_task), not the probes' median."""

from types import SimpleNamespace

import numpy as np
import pytest

from tilecast.loop import host_cost
from tilecast.loop.host_cost import long_submission_per_task, measure_probes


def test_the_probe_with_the_most_tasks_gives_the_cost():
    # short probes on warm caches at 1.4 us a task, the long one at 2.1 us: the long one, in any order
    got = long_submission_per_task([(163, 163 * 1.4e-6), (13402, 13402 * 2.1e-6), (1214, 1214 * 1.4e-6)])
    assert got == pytest.approx(2.1e-6)
    assert long_submission_per_task([]) == 0.0


def test_measure_probes_reports_the_longest_probes_cost(monkeypatch):
    def walls(workers, probes, repeats, sched, progress):
        for n, per_task in ((163, 1.5e-6), (1214, 1.4e-6), (2342, 1.6e-6), (13402, 2.2e-6), (264, 1.3e-6)):
            graph = SimpleNamespace(n_tiles=n, n_tasks=n)
            yield graph, 1e-3, 1e-4, None, n * per_task

    monkeypatch.setattr(host_cost, "measure_walls", walls)
    monkeypatch.setattr("tilecast.loop.runtime_overhead.task_overhead", lambda graph, trace: 2e-6)
    points, overheads, traced, submit = measure_probes(1)
    assert len(points) == len(traced) == 5
    assert submit == pytest.approx(2.2e-6)
    assert submit != pytest.approx(float(np.median([1.5e-6, 1.4e-6, 1.6e-6, 2.2e-6, 1.3e-6])))
