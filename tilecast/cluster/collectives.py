"""Alpha-beta costs of collectives, placed on the fabric(s) their group spans.

``n`` is always the size in bytes of the full buffer of one rank: the vector
being all-reduced, the gathered output of an all-gather, the input of a
reduce-scatter, everything one rank sends in an all-to-all. With ``p`` ranks,
per-step latency ``a`` and per-rank bandwidth ``B`` (link bandwidth times its
bus-bandwidth efficiency), the closed forms are (Thakur, Rabenseifner & Gropp,
"Optimization of collective communication operations in MPICH", IJHPCA 2005;
Chan et al. 2007):

============== ================================= ==============================
collective     ring / pairwise                   tree (pipelined binary trees)
============== ================================= ==============================
all-reduce     2(p-1) a + 2(p-1)/p n/B           2 ceil(log2 p) a + 2 n/B
all-gather     (p-1) a + (p-1)/p n/B             ceil(log2 p) a + n/B
reduce-scatter (p-1) a + (p-1)/p n/B             ceil(log2 p) a + n/B
all-to-all     (p-1) a + (p-1)/p n/B             (ring form)
point-to-point a + n/B
============== ================================= ==============================

Hierarchical all-reduce (intra-node then inter-node) = intra-node
reduce-scatter of n over k local ranks, an all-reduce of n/k across the nodes,
an intra-node all-gather of n. Hierarchical all-gather/reduce-scatter work the
same way. ``auto`` takes the fastest algorithm, as NCCL's tuner tries to.

Placement: ranks are numbered TP fastest, then DP, then PP (Megatron-LM's
order), so a group of stride ``stride`` has ``k = min(size, max(1,
gpus_per_node // stride))`` members on each node it touches. A group inside one
node uses the intra-node fabric; a flat algorithm on a group spanning nodes runs
at the inter-node rate (its slowest hop).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tilecast.cluster.hardware import Cluster, Fabric

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")
ALGOS = ("auto", "ring", "tree", "hierarchical")


class CollectiveError(ValueError):
    pass


@dataclass(frozen=True)
class Group:
    """A communicator: ``size`` ranks, ``per_node`` of them on each node it spans."""

    size: int
    per_node: int

    @property
    def nodes(self) -> int:
        return math.ceil(self.size / self.per_node)

    @classmethod
    def placed(cls, cluster: Cluster, size: int, stride: int) -> "Group":
        """The group of ``size`` ranks ``stride`` apart in the rank numbering."""
        per_node = min(size, max(1, cluster.gpus_per_node // max(1, stride)))
        return cls(size=size, per_node=per_node)


def _flat(op: str, n: float, p: int, f: Fabric, algo: str) -> float:
    a, B = f.latency, f.effective_bandwidth
    if p <= 1 or n <= 0:
        return 0.0
    if op == "p2p":
        return a + n / B
    if op == "all_reduce":
        if algo == "tree":
            return 2 * math.ceil(math.log2(p)) * a + 2 * n / B
        return 2 * (p - 1) * a + 2 * (p - 1) / p * n / B
    if op in ("all_gather", "reduce_scatter"):
        if algo == "tree":
            return math.ceil(math.log2(p)) * a + n / B
        return (p - 1) * a + (p - 1) / p * n / B
    if op == "all_to_all":
        return (p - 1) * a + (p - 1) / p * n / B
    raise CollectiveError(f"collective: unknown operation {op!r} (expected {', '.join(OPS)})")


def _hierarchical(op: str, n: float, g: Group, c: Cluster) -> float:
    k, m = g.per_node, g.nodes
    intra, inter = c.intra_node, c.inter_node
    if op == "all_reduce":
        return (_flat("reduce_scatter", n, k, intra, "ring") + min(_flat("all_reduce", n / k, m, inter, "ring"),
                      _flat("all_reduce", n / k, m, inter, "tree"))
                + _flat("all_gather", n, k, intra, "ring"))
    if op in ("all_gather", "reduce_scatter"):
        # inter-node phase moves n/k per rank across m nodes, then intra-node phase over the local ranks
        return _flat(op, n / k, m, inter, "ring") + _flat(op, n, k, intra, "ring")
    return math.inf


def _spanning(group: Group, c: Cluster) -> Fabric:
    """The rate of a flat ring/tree over a group that spans nodes.

    NCCL runs one ring (or tree) per channel and spreads the channels over the
    node's NICs, so the k ranks a group has on a node together use k NICs' worth
    of network: per-rank bandwidth k x (per-GPU NIC share), capped by NVLink.
    """
    bw = min(c.intra_node.effective_bandwidth, group.per_node * c.inter_node.effective_bandwidth)
    return Fabric(name=c.inter_node.name, bandwidth=bw, latency=c.inter_node.latency, efficiency=1.0)


def collective_time(op: str, nbytes: float, group: Group, cluster: Cluster, algo: str = "auto") -> float:
    """Seconds for one collective of ``nbytes`` (see the module docstring) on ``group``."""
    if op not in OPS:
        raise CollectiveError(f"collective: unknown operation {op!r} (expected {', '.join(OPS)})")
    if algo not in ALGOS:
        raise CollectiveError(f"collective: unknown algorithm {algo!r} (expected {', '.join(ALGOS)})")
    p = group.size
    if p <= 1 or nbytes <= 0:
        return 0.0
    fabric = cluster.intra_node if group.nodes == 1 else _spanning(group, cluster)
    if op == "p2p":
        return _flat(op, nbytes, 2, fabric, "ring")
    if algo in ("ring", "tree"):
        return _flat(op, nbytes, p, fabric, algo)
    if algo == "hierarchical":
        if group.nodes == 1 or group.per_node == 1:
            return _flat(op, nbytes, p, fabric, "ring")
        return _hierarchical(op, nbytes, group, cluster)
    best = min(_flat(op, nbytes, p, fabric, "ring"), _flat(op, nbytes, p, fabric, "tree"))
    if group.nodes > 1 and group.per_node > 1:
        best = min(best, _hierarchical(op, nbytes, group, cluster))
    return best


def p2p_time(nbytes: float, cluster: Cluster, crosses_node: bool) -> float:
    """A send/receive between neighbouring pipeline stages."""
    if nbytes <= 0:
        return 0.0
    return _flat("p2p", nbytes, 2, cluster.inter_node if crosses_node else cluster.intra_node, "ring")
