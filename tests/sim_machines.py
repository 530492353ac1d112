"""Machine descriptions built in tests (through the same validation as the shipped files)."""

from tilecast.perfmodel import parse_machine


def fig(v):
    return {"value": v, "source": "test figure"}


KIND = {"peak_tflops": fig(1.0), "memory_bandwidth_GBps": fig(100.0), "compute_efficiency": fig(1.0),
        "memory_efficiency": fig(1.0), "half_efficiency_gflop": fig(0.0), "launch_us": fig(0.0)}


def two_device_machine(capacity_gib=1.0, bw_gbps=1.0, lat_us=10.0, host_bw_gbps=None, overhead_us=0.0,
                       workers_per_device=1, n_devices=2, host_workers=0):
    """Host + ``n_devices`` devices, each with its own workers; devices linked directly and to the host.

    With ``host_workers``, CPU workers of a second kind run on the host memory node too.
    """
    doc = {
        "format": 1, "name": "test-devices",
        "runtime": {"task_overhead_us": fig(overhead_us)},
        "memory_nodes": [{"name": "host", "kind": "ram", "capacity_GiB": fig(64)},
                         {"name": "dev", "kind": "hbm", "count": n_devices, "capacity_GiB": fig(capacity_gib)}],
        "links": [{"name": "pcie", "between": ["host", "dev"], "bandwidth_GBps": fig(host_bw_gbps or bw_gbps),
                   "latency_us": fig(lat_us)}],
        "worker_kinds": {"acc": KIND},
        "workers": [],
    }
    if n_devices > 1:
        doc["switches"] = ["sw"]
        doc["links"].append({"name": "p2p", "between": ["dev", "sw"], "bandwidth_GBps": fig(bw_gbps),
                             "latency_us": fig(lat_us / 2)})
    for j in range(workers_per_device):
        doc["workers"].append({"name": f"w{j}_", "kind": "acc", "count": n_devices, "memory_node": "dev"})
    if host_workers:
        doc["worker_kinds"]["cpu"] = KIND
        doc["workers"].append({"name": "cpu", "kind": "cpu", "count": host_workers, "memory_node": "host"})
    return parse_machine(doc, where="test")


def cpu_machine(n_workers=2, overhead_us=0.0):
    doc = {
        "format": 1, "name": "test-cpu",
        "runtime": {"task_overhead_us": fig(overhead_us)},
        "memory_nodes": [{"name": "host", "kind": "ram", "capacity_GiB": fig(64)}],
        "worker_kinds": {"cpu": KIND},
        "workers": [{"name": "cpu", "kind": "cpu", "count": n_workers, "memory_node": "host"}],
    }
    return parse_machine(doc, where="test")
