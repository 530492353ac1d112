"""Cluster descriptions: shipped files load, figures are sane, bad files name the field."""

import copy

import pytest
import yaml

from tilecast.cluster.hardware import CLUSTER_DIR, ClusterError, available, from_dict, load_cluster


def test_shipped_clusters_load():
    names = available()
    assert {"dgx-a100", "dgx-h100", "dgx-h200"} <= set(names)
    for n in names:
        c = load_cluster(n)
        assert c.gpus_per_node == 8
        assert c.gpu.peak_flops["bf16"] > 1e14


def test_dgx_a100_figures():
    c = load_cluster("dgx-a100")
    assert c.gpu.peak_flops["bf16"] == 312e12
    assert c.nics_per_node == 8 and c.nic_bandwidth == 25e9  # 8 x 200 Gb/s
    assert c.inter_node.bandwidth == 25e9  # one NIC per GPU
    assert c.intra_node.bandwidth == 300e9


def test_h200_is_h100_with_more_memory():
    h100, h200 = load_cluster("dgx-h100"), load_cluster("dgx-h200")
    assert h200.gpu.peak_flops == h100.gpu.peak_flops
    assert h200.gpu.memory_bytes > h100.gpu.memory_bytes
    assert h200.gpu.memory_bandwidth > h100.gpu.memory_bandwidth


def test_efficiency_curve_monotone_and_bounded():
    c = load_cluster("dgx-a100")
    curve = c.gpu.matmul_efficiency["bf16"]
    xs = [1e6, 1e9, 1e11, 1e15]
    ys = [float(curve(x)) for x in xs]
    assert ys == sorted(ys) and 0 < ys[0] and ys[-1] <= 1


def _raw(name="dgx-a100"):
    with open(f"{CLUSTER_DIR}/{name}.yaml") as f:
        return yaml.safe_load(f)


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d["gpu"]["peak_flops"].update(bf16=-1), "gpu.peak_flops: bf16"),
        (lambda d: d["gpu"].pop("memory_bandwidth"), "memory_bandwidth"),
        (lambda d: d["inter_node"].update(nic_bandwidth="fast"), "nic_bandwidth"),
        (lambda d: d["intra_node"].update(efficiency=1.5), "efficiency"),
        (lambda d: d.update(gpus_per_node=7.5), "gpus_per_node"),
        (lambda d: d["gpu"]["matmul_efficiency"].update(bf16=[[1e9, 0.5], [1e8, 0.6]]), "matmul_efficiency.bf16"),
        (lambda d: d["gpu"]["peak_flops"].update(int3=1e12), "int3"),
        (lambda d: d.update(colour="green"), "colour"),
    ],
)
def test_bad_description_names_field(mutate, field):
    d = copy.deepcopy(_raw())
    mutate(d)
    with pytest.raises(ClusterError) as e:
        from_dict(d)
    assert field in str(e.value)


def test_unknown_cluster_is_reported():
    with pytest.raises(ClusterError, match="^cluster: "):
        load_cluster("dgx-z9000")


def test_scaled_multiplies_only_what_is_asked():
    c = load_cluster("dgx-h100")
    s = c.scaled(network_bandwidth=2.0, flops=0.5)
    assert s.inter_node.bandwidth == 2 * c.inter_node.bandwidth
    assert s.gpu.peak_flops["bf16"] == 0.5 * c.gpu.peak_flops["bf16"]
    assert s.intra_node == c.intra_node


def test_attention_efficiency_per_kernel():
    h100 = load_cluster("dgx-h100")
    assert set(h100.gpu.attention_efficiency) == {"flash", "cudnn"}
    assert h100.gpu.attention_fraction("cudnn") != h100.gpu.attention_fraction("flash")
    a100 = load_cluster("dgx-a100")
    assert a100.gpu.attention_fraction("cudnn") == a100.gpu.attention_fraction("flash")  # falls back
    d = copy.deepcopy(_raw())
    d["gpu"]["attention_efficiency"] = {"warp": 0.5}
    with pytest.raises(ClusterError, match="attention_efficiency.warp"):
        from_dict(d)
