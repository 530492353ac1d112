"""Machine descriptions: shipped files load, routes make sense, invalid files name the field."""

import copy

import pytest
import yaml

from tilecast.perfmodel import MachineError, list_machines, load_machine, parse_machine

GPU_MACHINES = ["a100-sxm4-80gb-8", "h100-sxm5-80gb-8", "h200-sxm-141gb-8"]


@pytest.mark.parametrize("name", GPU_MACHINES)
def test_shipped_gpu_nodes_load_with_sources(name):
    m = load_machine(name)
    assert len(m.workers) == 8 and len(m.nodes) == 9
    assert [m.workers[i].node for i in range(8)] == list(range(1, 9))
    for kind in m.kinds.values():
        assert set(kind.sources) == {"peak_tflops", "memory_bandwidth_GBps", "compute_efficiency",
                                     "memory_efficiency", "half_efficiency_gflop", "launch_us"}
        assert all(len(s) > 10 for s in kind.sources.values())
    # GPU to GPU goes over NVLink through the switch; host to GPU over PCIe.
    names = [m.links[i].name for i in m.routes[1][2]]
    assert names == ["nvlink:gpu0->nvswitch", "nvlink:nvswitch->gpu1"]
    assert [m.links[i].name for i in m.routes[0][3]] == ["pcie:host->gpu2"]
    assert m.transfer_time(1, 2, 1 << 30) < m.transfer_time(0, 1, 1 << 30)


def test_h200_has_more_memory_and_bandwidth_than_h100():
    h100, h200 = load_machine("h100-sxm5-80gb-8"), load_machine("h200-sxm-141gb-8")
    assert h200.nodes[1].capacity > h100.nodes[1].capacity
    assert h200.kinds["h200"].memory_bandwidth > h100.kinds["h100"].memory_bandwidth


def test_local_machine_is_detected_and_measured():
    m = load_machine("local")
    assert len(m.workers) >= 1 and len(m.nodes) == 1
    cpu = m.kinds["cpu"]
    assert 1e9 < cpu.peak_flops < 1e13  # a measured GEMM rate on one core
    assert 1e9 < cpu.memory_bandwidth < 1e12
    assert "measured" in cpu.sources["peak_tflops"]
    assert m.meta["hardware"]["cores"] == len(m.workers)
    assert "local" in list_machines()


def test_with_workers_keeps_a_prefix_and_checks_the_count():
    m = load_machine("h100-sxm5-80gb-8").with_workers(3)
    assert len(m.workers) == 3
    with pytest.raises(MachineError, match="workers must be between 1 and 3, got 9"):
        m.with_workers(9)


def test_fewer_workers_keep_the_fingerprint_that_calibrations_are_stored_under():
    full = load_machine("h100-sxm5-80gb-8")
    assert full.with_workers(1).fingerprint() == full.with_workers(8).fingerprint() == full.fingerprint()
    assert full.with_workers(3).with_task_overhead(1e-6).with_workers(2).fingerprint() == full.fingerprint()
    assert load_machine("a100-sxm4-80gb-8").with_workers(1).fingerprint() != full.fingerprint()


def _doc():
    with open(f"tilecast/perfmodel/machines/{GPU_MACHINES[1]}.yaml") as f:
        return yaml.safe_load(f)


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.pop("format"), "format"),
    (lambda d: d["memory_nodes"][1].pop("capacity_GiB"), "memory_nodes[1].capacity_GiB"),
    (lambda d: d["memory_nodes"][1]["capacity_GiB"].update(value=-1), "memory_nodes[1].capacity_GiB.value"),
    (lambda d: d["links"][0]["bandwidth_GBps"].pop("source"), "links[0].bandwidth_GBps"),
    (lambda d: d["links"][1].update(between=["gpu", "nowhere"]), "links[1].between"),
    (lambda d: d["workers"][0].update(memory_node="gpux"), "workers[0].memory_node"),
    (lambda d: d["workers"][0].update(kind="tpu"), "workers[0].kind"),
    (lambda d: d["workers"][0].update(count=3), "workers[0].count"),
    (lambda d: d["worker_kinds"]["h100"]["compute_efficiency"].update(value=1.5),
     "worker_kinds.h100.compute_efficiency.value"),
    (lambda d: d["worker_kinds"]["h100"].pop("launch_us"), "worker_kinds.h100.launch_us"),
    (lambda d: d.update(links=[]), "links"),
])
def test_invalid_descriptions_name_the_field(edit, field):
    d = copy.deepcopy(_doc())
    edit(d)
    with pytest.raises(MachineError, match=f"field {field.replace('[', '.').replace(']', '.')}"):
        parse_machine(d, where="test.yaml")


def test_unknown_machine_lists_the_known_ones():
    with pytest.raises(MachineError, match="h100-sxm5-80gb-8"):
        load_machine("no-such-machine")
