import os

import pytest

# Keep BLAS to one thread per process in tests: results must not depend on the machine's core count.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="module")
def probes():
    """The executor's scheduler probe graphs (tilecast.loop.host_cost.SCHED_PROBES), built once a module."""
    from tilecast.loop import host_cost

    return [g for *_, g in host_cost.probe_graphs(host_cost.SCHED_PROBES)]
