"""The simulator reproduces a saved reference exactly: start, end and worker of every task,
every transfer, peak memory, evictions and write-backs, bit for bit.

The reference (``data/sim_reference.npz``) was written by the simulator before
its speed work; any change to these figures must be a deliberate modelling
change, and then the file is rewritten with
``python3 tests/test_sim_reference.py --write`` and the reason given in the commit.
Durations are stored with the reference, so the duration model's floating
point (numpy's SIMD paths differ between CPUs) cannot move the comparison.
"""

import sys
from pathlib import Path

import numpy as np
import pytest
from sim_graphs import gemm_chain_graph, random_graph
from sim_machines import two_device_machine

from tilecast.graph import Tiling
from tilecast.graph.gpt2 import build_gpt2_step
from tilecast.graph.model_config import load_model
from tilecast.perfmodel import load_machine
from tilecast.perfmodel.kernel_model import DurationModel
from tilecast.simulator.simulate import POLICIES, simulate

REFERENCE = Path(__file__).parent / "data" / "sim_reference.npz"


def _graphs():
    return {
        "gpt2tiny": build_gpt2_step(load_model("gpt2-tiny"), 2, 64, Tiling.parse("32")),
        "chain": gemm_chain_graph(n_layers=3, tiles=4, tile=64),
        "random": random_graph(np.random.default_rng(7), 300, 40, tile=64),
    }


def _machines():
    return {
        "h100x8": load_machine("h100-sxm5-80gb-8"),
        # devices too small for the data: evictions and write-backs; a CPU kind on the host as well
        "tight": two_device_machine(capacity_gib=1.2 / 1024, bw_gbps=8.0, lat_us=5.0, host_bw_gbps=4.0,
                                    overhead_us=2.0, workers_per_device=2, n_devices=3, host_workers=1),
        "tight_devices": two_device_machine(capacity_gib=0.25 / 1024, bw_gbps=8.0, lat_us=5.0, host_bw_gbps=4.0,
                                            overhead_us=1.0, workers_per_device=2, n_devices=3),
        "tight_gpt2": two_device_machine(capacity_gib=1.0 / 1024, bw_gbps=8.0, lat_us=5.0, overhead_us=1.0,
                                         n_devices=2, host_workers=1),
    }


CASES = [  # (graph, machine, sched, transfers)
    *[("gpt2tiny", "h100x8", s, True) for s in POLICIES],
    ("gpt2tiny", "h100x8", "dmda", False),
    *[("gpt2tiny", "tight_gpt2", s, True) for s in ("dm", "dmda", "dmdas", "eager", "lws")],
    *[("chain", "tight", s, True) for s in ("dm", "dmda", "dmdas", "prio", "ws", "random")],
    *[("random", "tight", s, True) for s in ("dmda", "dmdas", "eager")],
    ("random", "h100x8", "dmda", True),
    *[(g, "tight_devices", s, True) for g in ("chain", "random") for s in ("dm", "dmda", "dmdas", "prio")],
    *[("gpt2tiny", "tight_devices", s, True) for s in ("dm", "dmda", "dmdas")],
]


def _key(case) -> str:
    return "-".join(str(x) for x in case)


def _run(case, graphs, machines, durations):
    g, m, sched, transfers = case
    return simulate(graphs[g], machines[m], sched, durations=durations, transfers=transfers, seed=3)


def _figures(res) -> dict:
    s = res.summary
    return {
        "start": res.start, "end": res.end, "worker": res.worker,
        **{f"tr_{k}": v for k, v in res.transfers.items()},
        "peak": np.array(list(s["peak_memory_bytes"].values()), dtype=np.int64),
        "counts": np.array([s["evictions"], s["writebacks"], s["transfers"]], dtype=np.int64),
        "makespan": np.array([s["makespan_s"], s["critical_path_s"], s["work_bound_s"]]),
    }


def write_reference() -> None:
    graphs, machines = _graphs(), _machines()
    out = {}
    for case in CASES:
        g, m = case[0], case[1]
        dkey = f"durations-{g}-{m}"
        if dkey not in out:
            out[dkey] = DurationModel(machines[m]).durations(graphs[g])
        for name, arr in _figures(_run(case, graphs, machines, out[dkey])).items():
            out[f"{_key(case)}/{name}"] = arr
    REFERENCE.parent.mkdir(exist_ok=True)
    np.savez_compressed(REFERENCE, **out)


@pytest.fixture(scope="module")
def setting():
    if not REFERENCE.exists():
        pytest.skip(f"no saved reference at {REFERENCE} (write it with python3 {__file__} --write)")
    return _graphs(), _machines(), np.load(REFERENCE)


@pytest.mark.parametrize("case", CASES, ids=_key)
def test_simulation_matches_the_saved_reference_exactly(case, setting):
    graphs, machines, ref = setting
    res = _run(case, graphs, machines, ref[f"durations-{case[0]}-{case[1]}"])
    got = _figures(res)
    for name, arr in got.items():
        want = ref[f"{_key(case)}/{name}"]
        assert arr.shape == want.shape, f"{name}: shape {arr.shape} != {want.shape}"
        assert np.array_equal(arr, want), f"{name} differs from the reference (first at {np.flatnonzero(arr != want)[:5]})"


def test_the_reference_exercises_evictions_and_write_backs(setting):
    _, _, ref = setting
    counts = np.array([ref[f"{_key(c)}/counts"] for c in CASES])
    assert counts[:, 0].max() > 0 and counts[:, 1].max() > 0, "no case evicts or writes back: the tight machines are not tight"


if __name__ == "__main__":
    if "--write" in sys.argv:
        write_reference()
        print(f"wrote {REFERENCE}")
