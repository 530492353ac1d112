"""Where the two distributed forecasts overlap: a data-parallel step on 2 nodes of one A100 each.

The cluster what-if (:mod:`tilecast.cluster`: per-layer costs, collectives, a timeline of streams) and
the rank simulator (:mod:`tilecast.simulator.ranks`: every tile task, StarPU-MPI's messages) predict the
same step on the same description:

- hardware: an A100-SXM4-80GB per node at the float32 peak tilecast's kernels use (19.5 TFLOPS, 2,039
  GB/s; ``tilecast/perfmodel/machines/a100-sxm4-80gb-8.yaml`` for the tile simulator, ``dgx-a100`` with
  ``gpus_per_node: 1, nodes: 2`` and dtype fp32 for the what-if); between the nodes the what-if's
  inter-node fabric of ``dgx-a100`` (one HDR NIC per GPU: 25 GB/s per direction, 10 us, 90 % of it
  reached), given to the rank simulator as its network (latency 10 us, 22.5 GB/s, no extra cost per
  message);
- the step: GPT-2 small (124 M), global batch ``--batch`` x ``--seq``, half the sequences per node, AdamW,
  float32 gradients; the tile simulator with the ``data`` distribution (ZeRO-3-like: partial gradients
  reduced on each parameter tile's owner, updated parameters fetched where read), the what-if as plain
  data parallelism (DDP) and as ZeRO-3, both with gradient reduction overlapped with the backward pass.

Prints both predictions side by side, each split into compute and the communication the step waits
for; the differences are explained in docs/mpi.md ("The cluster what-if and the rank simulator").

    python3 benchmarks/mpi_vs_cluster.py [--batch 8] [--seq 256] [--tile 128,batch=1]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from tilecast.cluster.evaluate import evaluate
from tilecast.cluster.hardware import load_cluster
from tilecast.graph.model_config import load_model as load_shape
from tilecast.cluster.strategy import layout
from tilecast.graph import Tiling
from tilecast.graph.distribution import prepare
from tilecast.graph.model_config import load_model
from tilecast.graph.models import build_step
from tilecast.perfmodel import load_machine
from tilecast.simulator.ranks import simulate_ranks
from tilecast.perfmodel.network import Network


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--tile", default="4096,batch=4", help="the rank simulator's tiling (default: a batch tile of "
                    "4 sequences, the what-if's micro-batch, so the GEMMs have its shapes)")
    ap.add_argument("--sched", default="dmda")
    ap.add_argument("--nic", choices=("node", "pair"), default="node",
                    help="the rank simulator's network: an interface per node, the cost per message in flight "
                         "(node, as simulate --ranks) or a link per pair of nodes holding each message's "
                         "latency (pair, the earlier model)")
    args = ap.parse_args()

    cluster = replace(load_cluster("dgx-a100"), gpus_per_node=1, nodes=2)
    f = cluster.inter_node
    net = Network(latency_s=f.latency, bandwidth_Bps=f.effective_bandwidth, message_s=0.0,
                  source=f"dgx-a100 inter_node ({f.name})")
    free = Network(latency_s=0.0, bandwidth_Bps=1e30, message_s=0.0, source="no network cost")
    shape = load_shape(args.model)
    rows = []
    for zero in (0, 3):
        strat = layout(gpus=2, dp=2, global_batch=args.batch, micro_batch=args.batch // 2, seq=args.seq,
                       dtype="fp32", grad_reduce_bytes=4, zero=zero, attention="unfused")
        r = evaluate(shape, strat, cluster)
        b = r.breakdown
        rows.append(dict(model="cluster what-if", layout="DDP" if zero == 0 else "ZeRO-3", step_s=r.step_s,
                         compute_s=b["compute_s"] + b["optimizer_s"], exposed_comm_s=b["exposed_comm_s"],
                         overlapped_comm_s=b["overlapped_comm_s"], bytes_per_node=None, messages=None))

    cfg = load_model(args.model)
    graph = build_step(cfg, args.batch, args.seq, Tiling.parse(args.tile))
    g, dist = prepare(graph, 2, "data")
    machine = load_machine("a100-sxm4-80gb-8")
    with_net = simulate_ranks(g, dist, machine, net, args.sched, 1, nic=args.nic)
    no_net = simulate_ranks(g, dist, machine, free, args.sched, 1, nic=args.nic)
    busy = max(r["busy_s"] for r in with_net.summary["per_rank"])
    rows.append(dict(model="rank simulator", layout="data (ZeRO-3-like)", step_s=with_net.makespan,
                     compute_s=busy, exposed_comm_s=with_net.makespan - no_net.makespan,
                     overlapped_comm_s=None, bytes_per_node=with_net.summary["bytes_moved"] / 2,
                     messages=with_net.summary["messages"], step_without_network_s=no_net.makespan,
                     tasks=g.n_tasks))
    print(f"{args.model}, global batch {args.batch} x {args.seq}, 2 nodes of one A100 (fp32), "
          f"network {net.source}: {net.latency_s * 1e6:.0f} us, {net.bandwidth_Bps / 1e9:.1f} GB/s; "
          f"tile simulator: tiling {args.tile}, {args.sched}, {g.n_tasks} tasks")
    print(f"{'forecast':<17}{'layout':<20}{'step ms':>10}{'compute ms':>12}{'exposed comm ms':>17}"
          f"{'moved/node MB':>15}{'msgs':>7}")
    for r in rows:
        moved = "" if r["bytes_per_node"] is None else f"{r['bytes_per_node'] / 1e6:.1f}"
        print(f"{r['model']:<17}{r['layout']:<20}{r['step_s'] * 1e3:>10.2f}{r['compute_s'] * 1e3:>12.2f}"
              f"{r['exposed_comm_s'] * 1e3:>17.2f}{moved:>15}{'' if r['messages'] is None else r['messages']:>7}")
    print(json.dumps({"rows": rows, "args": vars(args)}))


if __name__ == "__main__":
    main()
