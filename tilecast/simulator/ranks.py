"""Forecast a training step on N StarPU-MPI ranks with the one-node engine.

The machine is N copies of one node (:func:`ranks_machine`: the local
machine's workers split per rank, as ``tilecast run --ranks`` starts them),
one memory node each, joined by a directed network link per pair of ranks
(:mod:`tilecast.perfmodel.network`). The step is the graph the ranks
run (``distribution.prepare``) and StarPU-MPI's insert-task rule
(:mod:`tilecast.graph.owner_computes`):

- every task is pinned to its executing rank and scheduled there by that
  rank's own policy (:class:`tilecast.simulator.ranks_policy.RankPolicy`);
- every message of the rule (a tile sent to a rank that reads it and holds no
  valid copy: StarPU-MPI's cache, or a written tile sent back to its owner)
  becomes a task of its own, submitted where StarPU-MPI submits it (just
  before the task that needs it; just after a task that wrote a tile it does
  not own), held on its link for ``Network.seconds(bytes)``, one message after
  another per direction;
- dependencies are StarPU's, per rank: each rank has its own copy of a tile
  (the data item is the pair tile, rank); a message reads the sender's copy
  and writes the receiver's, so the receiver's readers wait for it, the
  sender's next writer waits for it to leave, and the next message into a
  cached copy waits for that copy's readers (:func:`tilecast.graph.deps.infer_dependencies`
  on the augmented access list).

The engine, its costs (per task, submission) and the policies are the
one-node simulator's (:class:`tilecast.simulator.engine.Engine`, general loop).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from tilecast.graph.deps import infer_dependencies
from tilecast.graph.owner_computes import plan as owner_plan
from tilecast.kernels.registry import R, W
from tilecast.perfmodel.machine import Link, Machine, MemoryNode, Worker
from tilecast.simulator.engine import Engine
from tilecast.perfmodel.network import Network
from tilecast.simulator.ranks_policy import RankPolicy

NET_KIND = "network"


def ranks_machine(machine: Machine, ranks: int, workers_per_rank: int, network: Network) -> Machine:
    """``ranks`` nodes of ``workers_per_rank`` of ``machine``'s workers each (its first ones), one memory node
    per rank (``rank<R>``), a directed ``net<S>-<D>`` link for every pair, and one link worker per link."""
    if not 1 <= workers_per_rank <= len(machine.workers):
        raise ValueError(f"workers_per_rank must be between 1 and {len(machine.workers)}, got {workers_per_rank}")
    nodes = [MemoryNode(f"rank{r}", "ram", machine.nodes[0].capacity) for r in range(ranks)]
    workers = [Worker(f"rank{r}.{w.name}", w.kind, r, w.units)
               for r in range(ranks) for w in machine.workers[:workers_per_rank]]
    links = [Link(f"net{s}-{d}", f"rank{s}", f"rank{d}", network.bandwidth_Bps,
                  network.latency_s + network.message_s)
             for s in range(ranks) for d in range(ranks) if s != d]
    workers += [Worker(link.name, NET_KIND, int(link.src[4:])) for link in links]
    return replace(machine, name=f"{machine.name}x{ranks}", nodes=nodes, workers=workers, links=links,
                   switches=[], meta={**machine.meta, "fingerprint": machine.fingerprint()})


@dataclass
class RankSimResult:
    """A simulated step on ranks: per task its rank, worker, start and end; the messages; a summary."""

    start: np.ndarray
    end: np.ndarray
    worker: np.ndarray
    task_rank: np.ndarray
    messages: dict  # src, dst, bytes, start, end, tile, task (the task whose submission sends it)
    summary: dict

    @property
    def makespan(self) -> float:
        return self.summary["makespan_s"]


def augmented_accesses(graph, task_rank: np.ndarray, transfers, ranks: int):
    """The step as every rank's StarPU sees it: tasks and messages in submission order, each with its
    accesses to (tile, rank) copies. Returns (order: per augmented task, the graph task (>= 0) or
    -(message index) - 1; acc_ptr, acc_tile, acc_mode)."""
    n = graph.n_tasks
    n_acc = np.diff(graph.acc_ptr)
    m = len(transfers)
    # sort key: a fetch just before its task, a task, a message sent back just after it
    key_task = np.r_[np.arange(n) * 3 + 1, transfers.task * 3 + np.where(transfers.back, 2, 0)]
    ident = np.r_[np.arange(n), -np.arange(m) - 1]
    order = ident[np.argsort(key_task, kind="stable")]
    counts = np.where(order >= 0, n_acc[np.maximum(order, 0)], 2)
    acc_ptr = np.r_[0, np.cumsum(counts)].astype(np.int64)
    tiles = np.empty(acc_ptr[-1], dtype=np.int64)
    modes = np.empty(acc_ptr[-1], dtype=graph.acc_mode.dtype)
    is_task = order >= 0
    # tasks: their accesses, on their rank's copies (tasks keep their order, so access k of the graph moves
    # by the messages' accesses inserted before its task)
    t_starts = acc_ptr[:-1][is_task]  # in task order
    shift = np.repeat(t_starts - graph.acc_ptr[:-1], n_acc)
    dst_idx = np.arange(len(graph.acc_tile), dtype=np.int64) + shift
    tiles[dst_idx] = graph.acc_tile.astype(np.int64) * ranks + task_rank[graph.access_task]
    modes[dst_idx] = graph.acc_mode
    # messages: read the sender's copy, write the receiver's
    k = -order[~is_task] - 1
    m_starts = acc_ptr[:-1][~is_task]
    tile = transfers.tile[k].astype(np.int64)
    tiles[m_starts] = tile * ranks + transfers.src[k]
    modes[m_starts] = R
    tiles[m_starts + 1] = tile * ranks + transfers.dst[k]
    modes[m_starts + 1] = W
    return order, acc_ptr, tiles, modes


def simulate_ranks(graph, distribution, machine: Machine, network: Network, sched: str = "dmda",
                   workers_per_rank: int = 1, durations: np.ndarray | None = None, calibration=None,
                   priority: np.ndarray | None = None, seed: int = 0, sharing=None,
                   nic: str = "pair", submit_task_s: float = 0.0, submit_cpu_task_s: float = 0.0,
                   submit_roles: dict | None = None, message_cpu_s: float = 0.0,
                   submit_share: float = 0.5, progress_task_s: float = 0.0,
                   submit_turns: bool = True) -> RankSimResult:
    """Simulate ``graph`` (as the ranks run it) under ``distribution`` on ``distribution.ranks`` copies of
    ``workers_per_rank`` workers of ``machine`` joined by ``network``.

    durations: (kinds of ``machine``, tasks) seconds, by default from the duration model with
    ``calibration``; priority: per task (higher first), by default the bottom levels for the policies
    that use them. The per-task cost, decision and submission costs are ``machine``'s.

    submit_task_s: s of a rank's main thread per task (wall), the order in which tasks join their ranks'
    queues; submit_cpu_task_s (with ``sharing``): its CPU time per task instead, the main threads then
    sharing the cores until they have submitted the step (:mod:`tilecast.simulator.ranks_submission`);
    submit_roles (with ``sharing``): that CPU time per task by the rank's role in it instead
    (:mod:`tilecast.simulator.submit_roles`: whether it runs the task, the messages it posts for it).
    submit_share: the main thread's part of its rank's first worker thread's slots while it submits, taken in
    turns of a slice (``submit_turns``) or at that part of the slots' speed throughout
    (:mod:`tilecast.simulator.ranks_submission`).
    message_cpu_s (with ``sharing`` where the progress thread runs worker 0): that thread's CPU per message on
    each side, which delays the worker's next task (:class:`tilecast.simulator.ranks_threads.ThreadedRankEngine`).
    progress_task_s (likewise): that thread's round of the progress loop before each task of worker 0.
    """
    from tilecast.graph import priorities as _prio
    from tilecast.simulator.simulate import POLICIES, USES_ESTIMATES, USES_PRIORITIES, task_priorities

    if sched not in POLICIES:
        raise ValueError(f"sched: unknown scheduling policy {sched!r} (known: {', '.join(POLICIES)})")
    ranks = distribution.ranks
    if len(distribution.owner) != graph.n_tiles:
        raise ValueError(f"distribution: {len(distribution.owner)} owners for {graph.n_tiles} tiles "
                         "(a distribution of another graph?)")
    base = machine.with_workers(workers_per_rank)
    if durations is None:
        from tilecast.perfmodel.kernel_model import DurationModel
        durations = DurationModel(base, calibration).durations(graph)
    durations = np.atleast_2d(np.asarray(durations, dtype=np.float64))
    n_kinds = len(base.kind_names)
    if durations.shape != (n_kinds, graph.n_tasks):
        raise ValueError(f"durations: shape {durations.shape}, expected ({n_kinds}, {graph.n_tasks})")
    if sharing is not None and (sharing.ranks, sharing.workers_per_rank) != (ranks, workers_per_rank):
        raise ValueError(f"sharing: describes {sharing.ranks} ranks of {sharing.workers_per_rank} workers, the "
                         f"simulation has {ranks} of {workers_per_rank}")
    p = owner_plan(graph, distribution.owner, ranks)
    tr = p.transfers
    big = ranks_machine(base, ranks, workers_per_rank, network)
    order, acc_ptr, acc_tile, acc_mode = augmented_accesses(graph, p.task_rank, tr, ranks)
    pred_ptr, pred = infer_dependencies(acc_ptr, acc_tile, acc_mode)
    n_aug = len(order)
    is_task = order >= 0
    task_ids = order[is_task]
    msg_ids = -order[~is_task] - 1

    # durations: the compute kinds as given; the network kind: each message's time on its link, less the
    # per-task cost the engine charges before every task
    kinds = big.kind_names
    dur = np.full((len(kinds), n_aug), np.inf)
    for i, kname in enumerate(base.kind_names):
        dur[kinds.index(kname), is_task] = durations[i, task_ids]
    if NET_KIND in kinds:  # one rank has no link
        dur[kinds.index(NET_KIND), ~is_task] = np.maximum(network.seconds(tr.nbytes[msg_ids]) - big.task_overhead,
                                                          0.0)
    if priority is None and sched in USES_PRIORITIES:
        full = task_priorities(durations + base.task_overhead, *graph.dependencies, sched)
    else:
        full = priority
    aug_prio = None
    if full is not None:
        aug_prio = np.zeros(n_aug)
        aug_prio[is_task] = np.asarray(full, dtype=np.float64)[task_ids]
    estimate = None
    if sched in USES_ESTIMATES:
        est = _prio.footprint_means(durations, _prio.footprint_groups(graph))
        estimate = dur.copy()
        for i, kname in enumerate(base.kind_names):
            estimate[kinds.index(kname), is_task] = est[i, task_ids]

    # workers: rank r's compute workers, then one per directed link
    n_compute = ranks * workers_per_rank
    rank_workers = [list(range(r * workers_per_rank, (r + 1) * workers_per_rank)) for r in range(ranks)]
    link_worker = {(s, d): n_compute + i for i, (s, d) in enumerate(
        (s, d) for s in range(ranks) for d in range(ranks) if s != d)}
    task_rank_aug = np.full(n_aug, -1, dtype=np.int64)
    task_rank_aug[is_task] = p.task_rank[task_ids]
    task_link = np.full(n_aug, -1, dtype=np.int64)
    task_link[~is_task] = [link_worker[(int(s), int(d))] for s, d in zip(tr.src[msg_ids], tr.dst[msg_ids])]
    kind_index = {k: i for i, k in enumerate(kinds)}
    release = None
    if sharing is not None and (submit_cpu_task_s > 0 or submit_roles):
        from tilecast.simulator.ranks_submission import Submitting, release_times

        if not np.isfinite(submit_cpu_task_s):
            raise ValueError(f"submit_cpu_task_s must be a finite number >= 0, got {submit_cpu_task_s!r}")
        cost = submit_cpu_task_s
        if submit_roles:
            from tilecast.simulator.submit_roles import role_counts, task_seconds

            cost = task_seconds(submit_roles, role_counts(p.task_rank, tr, ranks, graph))
        rel = release_times(sharing, graph.n_tasks, cost, submit_share, submit_turns)
        by_rank = np.empty(n_aug, dtype=np.int64)
        turn = np.empty(n_aug, dtype=np.int64)
        by_rank[is_task], turn[is_task] = p.task_rank[task_ids], task_ids
        by_rank[~is_task], turn[~is_task] = tr.src[msg_ids], tr.task[msg_ids]  # the sender's main thread posts it
        release = rel[by_rank, turn].tolist()
        sharing = Submitting(sharing, rel[:, -1] if graph.n_tasks else np.zeros(ranks), submit_share, submit_turns)
    elif submit_task_s > 0:
        if not np.isfinite(submit_task_s):
            raise ValueError(f"submit_task_s must be a finite number >= 0, got {submit_task_s!r}")
        turn = np.empty(n_aug)
        turn[is_task] = task_ids + 1
        turn[~is_task] = tr.task[msg_ids] + 1
        release = (turn * submit_task_s).tolist()
    policy = RankPolicy(lambda: POLICIES[sched](aug_prio, seed, estimate), task_rank_aug, task_link, rank_workers)
    args = (dur, pred_ptr, pred, [kind_index[w.kind] for w in big.workers], [w.node for w in big.workers], policy)
    kw = dict(overhead=big.task_overhead, decision_scan=big.decision_scan, decision_lock=big.decision_lock,
              submitted_at=release)
    if sharing is None and nic == "pair":
        eng = Engine(*args, **kw)
    else:
        from tilecast.simulator.ranks_threads import ThreadedRankEngine

        msg = np.full(n_aug, -1, dtype=np.int64)
        msg[~is_task] = msg_ids
        worker_rank = [r for r in range(ranks) for _ in range(workers_per_rank)] + [-1] * len(link_worker)
        eng = ThreadedRankEngine(*args, worker_rank=worker_rank, msg=msg.tolist(), msg_src=tr.src.tolist(),
                                 msg_dst=tr.dst.tolist(), msg_bytes=tr.nbytes.tolist(), network=network,
                                 sharing=sharing, nic=nic, message_cpu_s=message_cpu_s,
                                 progress_task_s=progress_task_s, **kw)
    eng.fused_loops = False  # RankPolicy has no fused loop; its sub-policies' would see only one rank
    eng.run()
    start, end, where = eng.arrays()
    pos = np.empty(graph.n_tasks, dtype=np.int64)
    pos[task_ids] = np.flatnonzero(is_task)
    mpos = np.empty(len(tr), dtype=np.int64)
    mpos[msg_ids] = np.flatnonzero(~is_task)
    # a message holds its link from when the link worker picks it up (before the per-task cost the engine
    # charges every task, which its duration left out)
    messages = dict(src=tr.src.astype(np.int64), dst=tr.dst.astype(np.int64), bytes=tr.nbytes.astype(np.int64),
                    start=start[mpos] - big.task_overhead, end=end[mpos], tile=tr.tile.astype(np.int64),
                    task=tr.task.astype(np.int64))
    t_start, t_end, t_worker = start[pos], end[pos], where[pos]
    last = float(end.max()) if n_aug else 0.0
    summary = _summary(graph, distribution, big, sched, workers_per_rank, network, p, t_start, t_end, t_worker,
                       messages, last)
    summary["nic"] = nic
    summary["last_event_s"] = last
    if sharing is not None and n_aug:  # run --ranks times the step to the barrier after the last event
        summary["makespan_s"] = sharing.step_end([r["end_s"] for r in summary["per_rank"]])
    if sharing is not None:
        summary["threads"] = {"cores": sharing.cores, "threads": sharing.threads, "background": sharing.background,
                              "slice_s": sharing.slice_s, "period_s": sharing.period,
                              "progress_drives_worker": sharing.progress_drives_worker,
                              "submit_end_s": getattr(sharing, "submit_end", None)}
    return RankSimResult(t_start, t_end, t_worker, p.task_rank.copy(), messages, summary)


def _summary(graph, distribution, machine, sched, wpr, network, p, start, end, worker, messages, makespan) -> dict:
    ranks = distribution.ranks
    busy = np.bincount(worker, weights=end - start + machine.task_overhead, minlength=ranks * wpr)[:ranks * wpr]
    rows = p.per_rank(graph)
    rank_end = np.zeros(ranks)
    np.maximum.at(rank_end, p.task_rank, end)
    if len(messages["bytes"]):
        np.maximum.at(rank_end, messages["dst"], messages["end"])
    link_busy = np.zeros((ranks, ranks))
    np.add.at(link_busy, (messages["src"], messages["dst"]), messages["end"] - messages["start"])
    for r in rows:
        rr = r["rank"]
        r["busy_s"] = float(busy[rr * wpr:(rr + 1) * wpr].sum())
        r["end_s"] = float(rank_end[rr])
        r["link_busy_s"] = float(link_busy[rr].sum())
    return {
        "sched": sched, "machine": machine.name, "distribution": distribution.name, "ranks": ranks,
        "workers_per_rank": wpr, "tasks": int(graph.n_tasks), "makespan_s": makespan,
        "messages": int(len(messages["bytes"])), "bytes_moved": int(messages["bytes"].sum()),
        "bytes_matrix": p.matrix().tolist(), "flops": float(graph.flops.sum()),
        "utilization": float(busy.sum() / (makespan * ranks * wpr)) if makespan > 0 else 0.0,
        "network": {"latency_s": network.latency_s, "message_s": network.message_s,
                    "bandwidth_Bps": network.bandwidth_Bps, "source": network.source},
        "per_rank": rows,
    }


def ranks_trace(result: RankSimResult, graph):
    """The simulated step as a trace (:mod:`tilecast.trace`, source ``sim``) laid out as a measured
    ``tilecast run --ranks --trace`` (:mod:`tilecast.executor.mpi_trace`): ``node`` = the rank, tasks on
    their worker, messages as rows of kernel ``transfer`` on the receiving rank's track
    ``MPI_TRACK + sender``, from when they take the wire to when they are received. ``tilecast compare``
    reads it beside a measured one."""
    from tilecast import trace as tracefile
    from tilecast.kernels import all_kernels

    names = np.array([k.name for k in all_kernels()], dtype=object)
    tags = np.array(graph.tags, dtype=object)[graph.tag] if graph.n_tasks else np.zeros(0, dtype=object)
    m = result.messages
    n, k = graph.n_tasks, len(m["bytes"])
    wpr = result.summary["workers_per_rank"]
    cols = dict(task=np.r_[np.arange(n), np.full(k, -1)].astype(np.int64),
                kernel=np.r_[names[graph.kernel], np.full(k, "transfer", dtype=object)],
                worker=np.r_[result.worker % wpr, tracefile.MPI_TRACK + m["src"]].astype(np.int64),
                node=np.r_[result.task_rank, m["dst"]].astype(np.int64),
                start_s=np.r_[result.start, m["start"]], end_s=np.r_[result.end, m["end"]],
                bytes=np.r_[np.asarray(graph.bytes, dtype=np.int64), m["bytes"]],
                flops=np.r_[graph.flops, np.zeros(k)],
                tag=np.r_[tags, np.array([f"mpi {s}->{d}" for s, d in zip(m["src"], m["dst"])], dtype=object)])
    return tracefile.with_step_time(tracefile.make_trace(**cols, source="sim"), result.makespan)
