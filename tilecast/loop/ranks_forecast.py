"""The predicted step time of a configuration on N StarPU-MPI ranks (``simulate --ranks``, ``tune --ranks``).

One path for every caller: build the step, apply the distribution (``distribution.prepare``), take the
kernel durations from the stored calibration and the runtime's costs from the host-cost fits of one
process of ``workers_per_rank`` workers (cost per task, decisions, submission), and simulate the ranks
(:func:`tilecast.simulator.ranks.simulate_ranks`) on the stored network
(:mod:`tilecast.perfmodel.network`).

**Shared cores.** The ranks of ``tilecast run --ranks`` share one machine's cores. Debian's StarPU 1.3
spins idle workers (``STARPU_NON_BLOCKING_DRIVERS``) and StarPU-MPI's progress thread polls while any
request is posted, so every rank keeps ``workers + 1`` threads runnable for the whole step, or
``workers`` where ``run --ranks`` lets the progress thread run worker 0 (the same rule,
:func:`tilecast.executor.mpi_threads.progress_drives_worker`). With ``background`` other runnable
threads, where they outnumber the cores the simulation runs every thread in time slices
(:class:`tilecast.simulator.ranks_threads.CoreSharing`): a kernel stretches over the other threads'
slices, a message leaves and is received only when the progress threads are on a core (and, when the
progress thread runs worker 0, between that worker's tasks). Messages share each rank's network
interface (``nic="node"``).

The step time is what ``run --ranks`` times, from a barrier to every task and message of every rank done
and the barrier of ``starpu_mpi_wait_for_all`` after them: the simulation's last event, and where the
cores are shared the turns the ranks' main threads wait for that barrier
(:meth:`tilecast.simulator.ranks_threads.CoreSharing.step_end`); loading the batch and flushing the cache
happen outside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RankForecast:
    model: str
    batch: int
    seq: int
    tiling: str
    sched: str
    ranks: int
    distribution: str
    workers_per_rank: int
    step_s: float
    tasks: int
    bytes_moved: int
    messages: int
    core_share: float
    summary: dict = field(default_factory=dict)
    result: object = None

    def row(self) -> dict:
        return {"model": self.model, "batch": self.batch, "seq": self.seq, "tiling": self.tiling,
                "sched": self.sched, "ranks": self.ranks, "distribution": self.distribution,
                "workers_per_rank": self.workers_per_rank, "pred_step_s": self.step_s,
                "tokens_per_s": self.batch * self.seq / self.step_s if self.step_s > 0 else 0.0,
                "tasks": self.tasks, "bytes_moved": self.bytes_moved, "messages": self.messages,
                "core_share": self.core_share}


def rank_machine_costs(machine, host_costs, workers_per_rank: int, sched: str):
    """``machine`` reduced to ``workers_per_rank`` workers with the runtime's costs measured for one process of
    that many workers under ``sched`` (when measured)."""
    from tilecast.loop.host_cost import host_cost_for

    m = machine.with_workers(workers_per_rank)
    host = host_cost_for(host_costs or {}, workers_per_rank, sched)
    if host is not None and host.task_overhead_s is not None:  # the rank loop charges no cost per buffer
        m = m.with_task_overhead(host.flat_task_overhead_s)
    if host is not None and host.decides:
        m = m.with_decision_cost(host.decision_scan_s, host.decision_lock_s)
    if host is not None and host.submit_task_s > 0:
        m = m.with_submission(host.submit_task_s)
    return m


def kernel_workers(machine, ranks: int, workers_per_rank: int) -> int:
    """How many workers are busy on the machine while the ranks run a step, for the kernels' durations: every
    rank's, up to the machine's. ``run --ranks`` starts its ranks on one machine, and their workers spin or run
    kernels through the whole step; calibration timed each shape with one worker busy and with all
    (:meth:`tilecast.perfmodel.calibration.Calibration.worker_factor`: on the 2-core Intel Xeon guest most
    kernels but the GEMM ran 5-45% faster alone), so a rank's worker runs at the speed of as many busy as the
    ranks hold together, not of its own rank's count."""
    return max(1, min(ranks * workers_per_rank, len(machine.workers)))


def core_sharing(machine, ranks: int, workers_per_rank: int, progress: str = "auto", background: float = 0.0,
                 slice_s: float | None = None):
    """The :class:`tilecast.simulator.ranks_threads.CoreSharing` of ``run --ranks`` on ``machine`` (None when
    its core count is unknown). ``progress``: ``auto`` (the progress thread runs worker 0 where the threads
    would outnumber the cores, as ``run --ranks`` does) or ``own``."""
    from tilecast.executor.mpi_threads import progress_drives_worker
    from tilecast.simulator.ranks_threads import CoreSharing, tick_slice_s

    if progress not in ("auto", "own"):
        raise ValueError(f"progress must be 'auto' or 'own', got {progress!r}")
    cores = machine.meta.get("hardware", {}).get("cores")
    if not cores:
        return None
    drives = progress == "auto" and progress_drives_worker(ranks, workers_per_rank, cores)
    return CoreSharing(int(cores), ranks, workers_per_rank, drives, float(background),
                       tick_slice_s(int(cores)) if slice_s is None else slice_s)


def forecast_ranks(cfg, batch: int, seq: int, tiling, sched: str, ranks: int, distribution: str, machine,
                   calibration, host_costs, network, workers_per_rank: int = 1, recompute: str = "none",
                   built=None, keep_result: bool = False, progress: str = "auto", background: float = 0.0,
                   nic: str = "node", slice_s: float | None = None, main_threads: bool = True,
                   pipeline_turns: bool = False, submit_roles: bool = True, message_cpu: bool = True,
                   submit_share: bool = True, task_costs: bool = True, submit_turns: bool = True,
                   machine_workers: bool = True) -> RankForecast:
    """Predict one step of ``cfg`` on ``ranks`` ranks. ValueError (naming ``ranks`` or ``distribution``)
    when the distribution cannot use that many ranks. ``progress``, ``background`` (other runnable threads
    on the machine), ``slice_s``: :func:`core_sharing`; ``nic``: ``node`` or ``pair``
    (:mod:`tilecast.simulator.ranks_threads`). ``main_threads``: the ranks' main threads share the cores while
    they submit, from the network's ``submit_cpu_task_s`` (:mod:`tilecast.simulator.ranks_submission`; False:
    tasks join their queues at ``submit_task_s`` of wall time per task, the earlier rule); their CPU time per
    task by the rank's role in it where the network holds ``submit_roles`` (``submit_roles=False``: the flat
    ``submit_cpu_task_s`` for every task, the earlier rule; :mod:`tilecast.simulator.submit_roles`).
    ``pipeline_turns``: a message above the rendezvous' first fragment (``Network.rendezvous_limit``) waits
    for a turn of the sender and then of the receiver after the receiver matched it, as Open MPI's protocol
    says (off by default: on the measured steps it turned the forecasts of tilings with such messages from
    10-43% short to 22-68% long, docs/mpi.md); without it such a message is received at the receiver's first
    turn.
    The ping-pong's per-protocol costs (``Network.protocol_s``) apply either way. ``submit_share``: a main thread
    has the part of its rank's slots the probe measured (``Network.submit_share``) while it submits (False, or
    none measured: half, the earlier rule), in turns of a time slice with its worker (``submit_turns``; False: at
    that part of the slots' speed throughout, the earlier rule; :mod:`tilecast.simulator.ranks_submission`).
    ``task_costs``: where the progress thread runs worker 0, that
    worker's round of the progress loop per task and the thread's CPU per message as the probe's traces measured
    them (``Network.progress_task_s``, ``Network.message_cpu_s``: :mod:`tilecast.loop.ranks_task_cost`); False,
    or none measured: no round, and ``message_s / 2`` per message (the earlier rule). ``machine_workers``: the
    kernels' durations as calibration timed them with as many workers busy on the machine as the ranks hold
    together (:func:`kernel_workers`; False: with a rank's own ``workers_per_rank`` busy, the earlier rule)."""
    from tilecast.graph.distribution import prepare
    from tilecast.graph.models import build_step
    from tilecast.perfmodel.kernel_model import DurationModel
    from tilecast.simulator.ranks import simulate_ranks
    from tilecast.simulator.ranks_submission import EVEN_SHARE

    built = built if built is not None else build_step(cfg, batch, seq, tiling, recompute=recompute)
    graph, dist = prepare(built, ranks, distribution)
    m = rank_machine_costs(machine, host_costs, workers_per_rank, sched)
    sharing = core_sharing(machine, ranks, workers_per_rank, progress, background, slice_s)
    busy = kernel_workers(machine, ranks, workers_per_rank) if machine_workers else workers_per_rank
    durations = DurationModel(machine.with_workers(busy) if busy != workers_per_rank else m,
                              calibration).durations(graph)
    if not pipeline_turns:
        from dataclasses import replace

        network = replace(network, rndv_bytes=1 << 62)
    cpu = network.submit_cpu_task_s if main_threads else 0.0
    roles = network.submit_roles if main_threads and submit_roles else None
    res = simulate_ranks(graph, dist, m, network, sched, workers_per_rank, durations=durations, sharing=sharing,
                         nic=nic, submit_task_s=0.0 if (cpu > 0 or roles) and sharing is not None
                         else network.submit_task_s, submit_cpu_task_s=cpu, submit_roles=roles,
                         message_cpu_s=message_cpu_of(network, task_costs) if message_cpu else 0.0,
                         submit_share=network.submit_share if submit_share and network.submit_share else EVEN_SHARE,
                         progress_task_s=(network.progress_task_s or 0.0) if task_costs else 0.0,
                         submit_turns=submit_turns)
    share = sharing.core_share if sharing is not None else 1.0
    s = res.summary
    return RankForecast(model=cfg.name, batch=batch, seq=seq, tiling=str(tiling), sched=sched, ranks=ranks,
                        distribution=distribution, workers_per_rank=workers_per_rank, step_s=res.makespan,
                        tasks=int(graph.n_tasks), bytes_moved=s["bytes_moved"], messages=s["messages"],
                        core_share=share, summary={**s, "task_overhead_s": m.task_overhead},
                        result=res if keep_result else None)


def message_cpu_of(network, task_costs: bool = True) -> float:
    """The progress thread's CPU per message on each side: the probe's traces' (``Network.message_cpu_s``) where
    measured and ``task_costs``, else half the ping-pong's cost per message."""
    if task_costs and network.message_cpu_s is not None:
        return float(network.message_cpu_s)
    return network.message_s / 2


def network_or_error(machine, ranks: int, workers_per_rank: int):
    """The stored network for the ranks (:func:`tilecast.perfmodel.network.load_network`), or
    LookupError saying how to measure it."""
    from tilecast.perfmodel.network import load_network

    net = load_network(machine, ranks, workers_per_rank)
    if net is None:
        raise LookupError(f"no network calibration for {ranks} ranks of {workers_per_rank} worker(s) on "
                          f"{machine.name}: run tilecast calibrate --ranks {ranks}"
                          + (f" --workers {workers_per_rank}" if workers_per_rank != 1 else ""))
    return net

