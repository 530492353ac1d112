"""Collective costs against their closed forms, and placement on the right fabric."""

import math

import pytest

from tilecast.cluster.collectives import CollectiveError, Group, collective_time, p2p_time
from tilecast.cluster.hardware import load_cluster

C = load_cluster("dgx-a100")
NV = C.intra_node
IB = C.inter_node


@pytest.mark.parametrize("p", [2, 4, 8])
def test_ring_all_reduce_inside_a_node(p):
    n = 256e6
    t = collective_time("all_reduce", n, Group(p, p), C, "ring")
    want = 2 * (p - 1) * NV.latency + 2 * (p - 1) / p * n / NV.effective_bandwidth
    assert t == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "all_to_all"])
def test_ring_gather_scatter_alltoall(op):
    n, p = 64e6, 8
    t = collective_time(op, n, Group(p, p), C, "ring")
    assert t == pytest.approx((p - 1) * NV.latency + (p - 1) / p * n / NV.effective_bandwidth)


def test_tree_all_reduce_across_nodes():
    n, p = 1e6, 64
    t = collective_time("all_reduce", n, Group(p, 1), C, "tree")
    assert t == pytest.approx(2 * 6 * IB.latency + 2 * n / IB.effective_bandwidth)


def test_tree_wins_for_small_messages_ring_for_large():
    g = Group(256, 1)
    small, large = 1e3, 1e11
    assert collective_time("all_reduce", small, g, C, "tree") < collective_time("all_reduce", small, g, C, "ring")
    assert collective_time("all_reduce", large, g, C, "ring") < collective_time("all_reduce", large, g, C, "tree")
    assert collective_time("all_reduce", small, g, C) == collective_time("all_reduce", small, g, C, "tree")


def test_hierarchical_all_reduce_is_sum_of_phases():
    n, k, m = 512e6, 8, 16
    t = collective_time("all_reduce", n, Group(k * m, k), C, "hierarchical")
    rs = (k - 1) * NV.latency + (k - 1) / k * n / NV.effective_bandwidth
    ar = min(2 * (m - 1) * IB.latency + 2 * (m - 1) / m * (n / k) / IB.effective_bandwidth,
             2 * math.ceil(math.log2(m)) * IB.latency + 2 * (n / k) / IB.effective_bandwidth)
    assert t == pytest.approx(2 * rs + ar)


def test_flat_ring_across_nodes_uses_the_nodes_nics():
    # k ranks per node drive k NICs: per-rank rate min(NVLink, k x NIC share), network latency per step
    n, k, m = 512e6, 4, 16
    p = k * m
    bw = min(NV.effective_bandwidth, k * IB.effective_bandwidth)
    want = 2 * (p - 1) * IB.latency + 2 * (p - 1) / p * n / bw
    assert collective_time("all_reduce", n, Group(p, k), C, "ring") == pytest.approx(want)
    one_per_node = collective_time("all_reduce", n, Group(p, 1), C, "ring")
    assert one_per_node > collective_time("all_reduce", n, Group(p, k), C, "ring")
    # small messages across many ranks: the hierarchical algorithm's fewer network steps win
    assert (collective_time("all_reduce", 1e5, Group(512, 8), C, "hierarchical")
            < collective_time("all_reduce", 1e5, Group(512, 8), C, "ring"))


def test_placement_tp_inside_node_dp_across():
    tp = Group.placed(C, 8, stride=1)
    dp = Group.placed(C, 16, stride=8)
    assert tp.nodes == 1 and tp.per_node == 8
    assert dp.per_node == 1 and dp.nodes == 16
    mixed = Group.placed(C, 16, stride=2)
    assert mixed.per_node == 4 and mixed.nodes == 4
    # the same bytes cost more across nodes than on NVLink
    n = 100e6
    assert collective_time("all_reduce", n, Group(8, 1), C) > collective_time("all_reduce", n, Group(8, 8), C)


def test_p2p_and_trivial_groups():
    assert p2p_time(1e6, C, crosses_node=True) == pytest.approx(IB.latency + 1e6 / IB.effective_bandwidth)
    assert p2p_time(1e6, C, crosses_node=False) < p2p_time(1e6, C, crosses_node=True)
    assert collective_time("all_reduce", 1e9, Group(1, 1), C) == 0.0


def test_more_bandwidth_is_never_slower():
    fast = C.scaled(network_bandwidth=2.0, nvlink_bandwidth=2.0)
    for op in ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]:
        for g in [Group(8, 8), Group(64, 1), Group(64, 8), Group(32, 4)]:
            assert collective_time(op, 3e8, g, fast) <= collective_time(op, 3e8, g, C)


def test_unknown_op_named():
    with pytest.raises(CollectiveError, match="broadcast"):
        collective_time("broadcast", 1, Group(2, 2), C)
