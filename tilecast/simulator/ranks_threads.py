"""The ranks' threads on the cores they share, and the network interfaces their messages share.

:func:`tilecast.simulator.ranks.simulate_ranks` uses :class:`ThreadedRankEngine` when it is given a
:class:`CoreSharing` or ``nic="node"``. Three rules, each after what StarPU 1.3.10 and Linux do:

- **Time slices.** Every rank keeps its threads runnable through a step: its workers spin when idle
  (``STARPU_NON_BLOCKING_DRIVERS``, ``_starpu_get_worker_task`` and ``_starpu_exponential_backoff`` in
  ``src/drivers/driver_common/driver_common.c``) and its progress thread polls while a request is
  pending (``_starpu_mpi_progress_thread_func``, ``mpi/src/mpi/starpu_mpi_mpi.c``), unless it runs
  worker 0 itself (``STARPU_MPI_DRIVER_CALL_FREQUENCY``, :mod:`tilecast.executor.mpi_threads`). Where
  these threads, with ``background`` threads of other work, outnumber the cores, the kernel's scheduler
  runs them in turn, one slice each (Linux's EEVDF: ``sysctl_sched_base_slice``, 0.75 ms scaled by
  1 + log2(cores), ``kernel/sched/fair.c``). A thread is on a core during its slice of every period
  (``period = slice x threads / cores``); a rank's threads take consecutive slots of one core, and the
  cores' turns are staggered (:meth:`CoreSharing.phase`). A task
  runs only while its worker's thread is on (its time stretches over the others' slices).
- **Polls.** A message leaves when the sender's progress thread is on and polls, and is received when
  the receiver's is: the progress thread posts the send (``_starpu_mpi_handle_ready_request`` on its
  ready list) and tests the envelope and the data (``_starpu_mpi_comm_test_recv``,
  ``_starpu_mpi_test_detached_requests``). When that thread runs worker 0, it polls only between
  that worker's tasks (``starpu_driver_run_once`` runs one task to its end), so a message waits for the
  task running there to end.
- **Network interfaces** (``nic="node"``): a rank's outgoing messages share its interface and its
  incoming ones too (full duplex): a message holds the sender's outgoing and the receiver's incoming
  interface for ``bytes / bandwidth``, in the order the messages leave. ``nic="pair"`` keeps one link
  per pair of ranks, as :mod:`tilecast.simulator.ranks` models without this engine.
- **Per-message cost** (``message_s``, the ping-pong's intercept less MPI's latency): in flight, like
  the latency, not held on an interface. StarPU-MPI does not handle one message at a time: a task's
  sends and receives are submitted as detached requests (``_starpu_mpi_isend_irecv_common``,
  ``mpi/src/starpu_mpi.c``); each round of the progress loop posts up to ``STARPU_MPI_NREADY_PROCESS``
  ready requests with non-blocking ``MPI_Isend``/``MPI_Irecv`` (``_starpu_mpi_handle_ready_request``,
  ``_starpu_mpi_isend_size_func``) and then tests every pending one
  (``_starpu_mpi_test_detached_requests``), all in ``_starpu_mpi_progress_thread_func``
  (``mpi/src/mpi/starpu_mpi_mpi.c``), so messages posted together pay that round once, not once each.
  (Held on the interface, a cost per message made a step of many messages, the ``data`` distribution's
  parameter gathers and partial gradients, a queue of them: 274 messages x 1.5 ms on one interface.)
- **Slices** last whole timer ticks (:func:`tick_slice_s`).
- **A window of sends.** StarPU-MPI keeps at most ``STARPU_MPI_NDETACHED_SEND`` (10) detached sends of a
  rank in flight: its progress loop posts a ready send only while fewer are pending, and a send leaves the
  count when ``MPI_Test`` reports it complete (``_starpu_mpi_progress_thread_func``,
  ``_starpu_mpi_test_detached_requests``, ``mpi/src/mpi/starpu_mpi_mpi.c``). Above the transport's eager
  size (:func:`tilecast.perfmodel.network.eager_for`: Open MPI's shared memory, 4 KB with the header) a
  send completes only after the receiver has matched it (rendezvous), at the sender's next poll after
  that; below, as it leaves. So when many sends are ready at once (``data``'s parameter tiles and partial
  gradients), they go 10 at a time, each ten waiting for a receiver's and a sender's turn.
- **The step's end** is timed after a barrier that the ranks' main threads must wake for
  (:meth:`CoreSharing.step_end`).
- **A pipelined rendezvous** (above the first fragment, ``Network.protocol`` = ``pipeline``): received at the
  receiver's turn after the sender's turn after the receiver matched it (:meth:`ThreadedRankEngine._matched`);
  :func:`tilecast.loop.ranks_forecast.forecast_ranks` turns it off unless ``pipeline_turns``. Each message
  also pays its protocol's ping-pong cost in flight (``Network.protocol_extra_s``).
- **The main threads** while they submit: :mod:`tilecast.simulator.ranks_submission`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tilecast.simulator.engine import Engine


def default_slice_s(cores: int) -> float:
    """Linux's base time slice on ``cores`` cores: 0.75 ms x (1 + log2(min(cores, 8))) (EEVDF's
    ``sysctl_sched_base_slice`` with the default logarithmic scaling, ``get_update_sysctl_factor``)."""
    return 0.75e-3 * (1 + int(math.log2(max(1, min(cores, 8)))))


def kernel_hz(default: int = 250) -> int:
    """The running kernel's timer frequency (``CONFIG_HZ`` from ``/proc/config.gz``), else ``default``
    (250: Debian's and the kernel's default)."""
    import gzip

    try:
        with gzip.open("/proc/config.gz", "rt") as f:
            for line in f:
                if line.startswith("CONFIG_HZ="):
                    return int(line.split("=", 1)[1])
    except (OSError, ValueError):
        pass
    return default


def tick_slice_s(cores: int, hz: int | None = None) -> float:
    """The time a CPU-bound thread keeps a core before another runnable one gets it: the base slice
    (:func:`default_slice_s`) rounded up to whole timer ticks of 1 / ``hz`` s. A running thread's slice is
    checked against its deadline only at the tick (``task_tick_fair`` → ``update_curr`` →
    ``update_deadline`` then ``resched_curr``, ``kernel/sched/fair.c``), not at the deadline itself, unless
    the ``HRTICK`` scheduler feature is on (off by default, ``kernel/sched/features.h``). On a 250 Hz kernel
    with 2 cores: 1.5 ms rounded up to 4 ms (the 8 and 12 ms pauses of a rank's worker beside 2 or 3
    other threads in measured traces)."""
    tick = 1.0 / (hz or kernel_hz())
    return math.ceil(default_slice_s(cores) / tick - 1e-9) * tick


@dataclass(frozen=True)
class CoreSharing:
    """``ranks`` ranks of ``workers_per_rank`` workers (and a progress thread each, unless it runs worker 0)
    and ``background`` other runnable threads on ``cores`` cores, in time slices of ``slice_s``."""

    cores: int
    ranks: int
    workers_per_rank: int
    progress_drives_worker: bool
    background: float = 0.0
    slice_s: float = 1.5e-3

    def __post_init__(self):
        if self.cores < 1:
            raise ValueError(f"cores must be at least 1, got {self.cores}")
        if not (self.background >= 0 and math.isfinite(self.background)):
            raise ValueError(f"background must be a number of threads >= 0, got {self.background!r}")
        if not self.slice_s > 0:
            raise ValueError(f"slice_s must be positive, got {self.slice_s!r}")

    @property
    def threads_per_rank(self) -> int:
        return self.workers_per_rank + (0 if self.progress_drives_worker else 1)

    @property
    def threads(self) -> int:
        return self.ranks * self.threads_per_rank

    @property
    def slots(self) -> int:
        """The ranks' threads per core."""
        return -(-self.threads // self.cores)

    @property
    def period(self) -> float:
        return self.slice_s * max(self.slots, (self.threads + self.background) / self.cores)

    @property
    def shared(self) -> bool:
        return self.threads + self.background > self.cores

    @property
    def core_share(self) -> float:
        """How much longer a kernel takes on average (1 when every thread has a core)."""
        return self.period / self.slice_s if self.shared else 1.0

    def worker_thread(self, rank: int, worker: int) -> int:
        return rank * self.threads_per_rank + worker

    def progress_thread(self, rank: int) -> int:
        return rank * self.threads_per_rank + (0 if self.progress_drives_worker else self.workers_per_rank)

    def on_time(self, thread: int, t0: float, t1: float) -> float:
        """Seconds ``thread`` is on a core between ``t0`` and ``t1``."""
        if t1 <= t0:
            return 0.0
        if not self.shared:
            return t1 - t0
        p, s, ph = self.period, self.slice_s, self.phase(thread)

        def upto(t):  # on-core time from the phase's origin to t (may be negative)
            k = math.floor((t - ph) / p)
            return k * s + min(t - ph - k * p, s)

        return upto(t1) - upto(t0)

    def phase(self, thread: int) -> float:
        """When ``thread``'s slice starts in each period: the ranks' threads fill the slots of one core after
        another (a rank's threads in consecutive slots), and the cores' turns are staggered over the period
        (the kernel does not run the cores' threads in step)."""
        return (thread % self.slots) * self.slice_s + (thread // self.slots) * self.period / self.cores

    def _on(self, thread: int, t: float) -> tuple[float, float]:
        """(the earliest time from ``t`` at which ``thread`` is on a core, how far into its slice that is)."""
        p, s = self.period, self.slice_s
        x = (t - self.phase(thread)) % p
        return (t, x) if x < s else (t + (p - x), 0.0)

    def next_on(self, thread: int, t: float) -> float:
        """The earliest time from ``t`` at which ``thread`` is on a core."""
        return self._on(thread, t)[0] if self.shared else t

    def next_turn(self, thread: int, t: float) -> float:
        """When a thread of ``thread``'s rank that wakes at ``t`` (its main thread) first runs: the start of
        that rank's next slot after ``t`` (the rank's session shares its cores' time, so a woken thread takes
        a slot of its own rank, not an extra one); ``t`` when every thread has a core."""
        if not self.shared:
            return t
        x = (t - self.phase(thread)) % self.period
        return t + (self.period - x)

    def wake(self, thread: int, t: float) -> float:
        """When the main thread of ``thread``'s rank, woken at ``t``, runs: where other work holds the cores,
        at the rank's next slot (:meth:`next_turn`; measured at load 11-13: steps ending 68-75 ms after their
        last task); where the cores are the ranks' alone, at once (the rank's spinning progress thread yields
        to the woken thread, EEVDF's wakeup preemption; measured on the quiet AMD EPYC: steps ending 0.1-0.3 ms
        after their last task). Between the two the wait scales with the other work per core, in full from
        one thread of it per core (a ``background`` of 0.01-0.2, what a quiet machine measures, does not
        charge the turns a loaded one does)."""
        if not self.shared:
            return t
        return t + min(1.0, self.background / self.cores) * (self.next_turn(thread, t) - t)

    def step_end(self, rank_end) -> float:
        """When ``run --ranks``'s step ends, given when each rank's last task or message ended: each rank's
        main thread, asleep in ``starpu_task_wait_for_all``, wakes (a turn), sends the keep-alive message
        its progress thread handles (:mod:`tilecast.executor.mpi_threads`; the progress thread's next
        poll), sleeps again in ``starpu_mpi_barrier`` until the progress thread has no request left
        (``_starpu_mpi_barrier``, ``mpi/src/mpi/starpu_mpi_mpi.c``) and wakes (a turn); ``MPI_Barrier``
        then ends when the last rank is there and every other rank next runs
        (``starpu_mpi_wait_for_all`` = ``starpu_task_wait_for_all`` + ``starpu_mpi_barrier``,
        ``mpi/src/starpu_mpi.c``). The last event itself when every thread has a core (microseconds); a wake
        waits as :meth:`wake` says."""
        rank_end = list(rank_end)
        if not self.shared:
            return max(rank_end)
        there = []
        for r, t in enumerate(rank_end):
            th = self.progress_thread(r)
            t = self.wake(th, t)  # the main thread wakes
            t = self.next_on(th, t)  # the progress thread handles the keep-alive message
            there.append(self.wake(th, t))  # the main thread wakes from the barrier's wait
        last = max(there)
        return max(self.next_on(self.progress_thread(r), last) for r in range(len(rank_end)))

    def finish(self, thread: int, t: float, work: float) -> float:
        """When ``thread``, starting at ``t``, has had ``work`` seconds on a core."""
        if not self.shared or work <= 0.0:
            return t + max(work, 0.0)
        p, s = self.period, self.slice_s
        t, x = self._on(thread, t)
        left = s - x
        if work <= left:
            return t + work
        work -= left
        t += left + (p - s)  # the start of its next slice
        full = math.ceil(work / s) - 1  # whole slices before the one it ends in
        return t + full * p + (work - full * s)


class ThreadedRankEngine(Engine):
    """The one-node engine with the rules of this module for the rank simulation's tasks and messages.

    ``worker_rank``: per worker, its rank (compute workers) or -1 (link workers); ``msg``: per task, its
    message index or -1; ``msg_src``, ``msg_dst``, ``msg_bytes``: per message; ``network``:
    :class:`tilecast.perfmodel.network.Network`; ``sharing``: :class:`CoreSharing` or None (a core per
    thread); ``nic``: ``node`` or ``pair``.
    """

    def __init__(self, *args, worker_rank, msg, msg_src, msg_dst, msg_bytes, network, sharing=None,
                 nic: str = "node", ndetached_send: int = 10, message_cpu_s: float = 0.0,
                 progress_task_s: float = 0.0, **kw):
        if nic not in ("node", "pair"):
            raise ValueError(f"nic must be 'node' or 'pair', got {nic!r}")
        super().__init__(*args, **kw)
        if self.memory is not None:
            raise ValueError("the rank simulation models no memory nodes")
        self.worker_rank = list(worker_rank)
        self.msg = list(msg)
        self.msg_src, self.msg_dst, self.msg_bytes = list(msg_src), list(msg_dst), list(msg_bytes)
        self.net = network
        # StarPU-MPI's window of detached sends per rank (STARPU_MPI_NDETACHED_SEND, default 10,
        # _starpu_mpi_progress_init) and the size above which a send completes only once acknowledged
        self.eager = network.eager_limit() if hasattr(network, "eager_limit") else None
        self.window = ndetached_send
        self.in_flight = [0] * (max(worker_rank) + 1)
        self.waiting: list = [[] for _ in range(max(worker_rank) + 1)]
        self.sharing = sharing
        self.nic = nic
        ranks = max(self.worker_rank) + 1
        wpr = sum(1 for r in self.worker_rank if r == 0)
        self.first_worker = [r * wpr for r in range(ranks)]
        self.local_index = [w - r * wpr if r >= 0 else -1 for w, r in enumerate(self.worker_rank)]
        self.out_free = [0.0] * ranks
        self.in_free = [0.0] * ranks
        self.pair_free: dict = {}
        self.current_end = [0.0] * self.n_workers  # the end of the task each worker runs (or ran last)
        # the progress thread's CPU per message on each side (posting the send; testing, completing and releasing
        # the receive), taken from worker 0 where that thread runs it
        self.message_cpu = float(message_cpu_s) if sharing is not None and sharing.progress_drives_worker else 0.0
        # and its round of the progress loop before each task of that worker (tilecast.loop.ranks_task_cost)
        self.progress_task = float(progress_task_s) if sharing is not None and sharing.progress_drives_worker \
            else 0.0

    def _thread(self, w: int) -> int:
        return self.sharing.worker_thread(self.worker_rank[w], self.local_index[w]) if self.sharing else 0

    def _poll(self, rank: int, t: float) -> float:
        """When ``rank``'s progress thread next polls, from ``t``."""
        sh = self.sharing
        if sh is None:
            return t
        if sh.progress_drives_worker:
            w0 = self.first_worker[rank]
            if self.busy[w0] and self.current_end[w0] > t:
                t = self.current_end[w0]
        return sh.next_on(sh.progress_thread(rank), t)

    def _progress_work(self, rank: int, t: float) -> None:
        """The rank's progress thread, running worker 0, handles a message from ``t``: that worker begins no
        task before it is done (:attr:`message_cpu`)."""
        if self.message_cpu <= 0.0:
            return
        w0 = self.first_worker[rank]
        h = self.hold[w0]
        start = t if t >= h else h
        self.hold[w0] = self.sharing.finish(self._thread(w0), start, self.message_cpu)

    def _begin(self, w: int, t: int) -> None:
        if self.msg[t] >= 0:
            self._send(w, t)
            return
        env = self.env
        now = env._now
        begin = now if now >= self.sched_free else self.sched_free
        if self.hold[w] > begin:
            begin = self.hold[w]
        d = self.duration[self.worker_kind[w]][t]
        if self.sharing is not None:
            th = self._thread(w)
            over = self.overhead + (self.progress_task if self.local_index[w] == 0 else 0.0)
            begin = self.sharing.finish(th, begin, over)
            begin = self.sharing.next_on(th, begin) if d > 0 else begin
            end = self.sharing.finish(th, begin, d)
        else:
            begin = begin + self.overhead
            end = begin + d
        if self._started is not None:
            self._started(t, w, begin)
        self.busy[w] = True
        self.idle.discard(w)
        self.start[t], self.end[t], self.where[t] = begin, end, w
        self.current_end[w] = end
        env.timeout(end - now, t).callbacks.append(self._finish)

    def _send(self, w: int, t: int) -> None:
        k = self.msg[t]
        src = self.msg_src[k]
        if self.eager is not None and self.in_flight[src] >= self.window:
            # StarPU-MPI posts no more sends while ndetached_send of the rank's are not complete
            # (_starpu_mpi_progress_thread_func); the link waits with this one
            self.busy[w] = True
            self.idle.discard(w)
            self.waiting[src].append((w, t))
            return
        self._send_now(w, t)

    def _send_done(self, src: int) -> None:
        self.in_flight[src] -= 1
        if self.waiting[src]:
            w, t = self.waiting[src].pop(0)
            self._send_now(w, t)

    def _send_now(self, w: int, t: int) -> None:
        env = self.env
        now = env._now
        k = self.msg[t]
        src, dst = self.msg_src[k], self.msg_dst[k]
        net = self.net
        # the interfaces are held for the bytes only; the per-message cost (StarPU-MPI's handling of the
        # request on both sides, the ping-pong's intercept) is in flight, like the latency: messages posted
        # together overlap it (see the module's docstring, "Per-message cost")
        hold = self.msg_bytes[k] / net.bandwidth_Bps
        leave = self._poll(src, now)
        self._progress_work(src, leave)
        if self.nic == "node":
            wire = max(leave, self.out_free[src], self.in_free[dst])
            self.out_free[src] = self.in_free[dst] = wire + hold
        else:
            wire = max(leave, self.pair_free.get((src, dst), 0.0))
            self.pair_free[(src, dst)] = wire + hold
        arrive = wire + hold + net.message_s + net.latency_s
        if self.eager is not None and hasattr(net, "protocol_extra_s"):
            arrive += net.protocol_extra_s(self.msg_bytes[k])  # the protocol's handshakes, as the ping-pong saw
        if self.eager is not None:
            self.in_flight[src] += 1
            if self.msg_bytes[k] <= self.eager:  # buffered: complete at the sender's next test
                env.timeout(wire - now).callbacks.append(lambda ev, src=src: self._send_done(src))
        self.busy[w] = True
        self.idle.discard(w)
        # start: when it takes the wire, plus the per-task cost the rank summary takes off every message
        self.start[t], self.end[t], self.where[t] = wire + self.overhead, arrive, w
        env.timeout(arrive - now, t).callbacks.append(self._arrived)
        env.timeout(wire + hold - now).callbacks.append(lambda ev, w=w: self._link_free(w))

    def _arrived(self, ev) -> None:
        """The message is there: it is received when the receiver's progress thread next polls (a pipelined
        rendezvous: :meth:`_matched` first)."""
        t = ev._value
        now = self.env._now
        k = self.msg[t]
        done = self._poll(self.msg_dst[k], now)
        self._progress_work(self.msg_dst[k], done)
        self.end[t] = done
        then = self._matched if self._pipelined(k) else self._received
        if done > now:
            self.env.timeout(done - now, t).callbacks.append(then)
        else:
            then(ev)

    def _pipelined(self, k: int) -> bool:
        return self.eager is not None and hasattr(self.net, "protocol") and \
            self.net.protocol(self.msg_bytes[k]) == "pipeline"

    def _matched(self, ev) -> None:
        """A pipelined rendezvous (above the transport's first fragment, ``Network.rendezvous_limit``): the
        receiver's poll has matched the first fragment and sent the acknowledgement (ob1's rendezvous
        protocol, Open MPI ``ompi/mca/pml/ob1``: the receive posted by ``_starpu_mpi_handle_ready_request``
        matches it); the sender sends the rest when its progress thread next tests its request
        (``MPI_Test`` in ``_starpu_mpi_test_detached_requests`` drives Open MPI's progress), and the receiver
        has it at its own next poll after that."""
        t = ev._value
        now = self.env._now
        k = self.msg[t]
        sent = self._poll(self.msg_src[k], now + self.net.latency_s)
        self.end[t] = sent
        self.env.timeout(sent - now, t).callbacks.append(self._rest_sent)

    def _rest_sent(self, ev) -> None:
        t = ev._value
        now = self.env._now
        done = self._poll(self.msg_dst[self.msg[t]], now + self.net.latency_s)
        self.end[t] = done
        self.env.timeout(done - now, t).callbacks.append(self._received)

    def _link_free(self, w: int) -> None:
        self.busy[w] = False
        self.idle.add(w)
        nxt = self.policy.pop(w)
        if nxt >= 0:
            self._begin(w, nxt)

    def _received(self, ev) -> None:
        t = ev._value
        k = self.msg[t]
        if self.eager is not None and self.msg_bytes[k] > self.eager:
            # rendezvous: the receiver has matched it; the sender's request completes when its progress
            # thread next tests it after the acknowledgement arrives
            src = self.msg_src[k]
            now = self.env._now
            done = self._poll(src, now + self.net.latency_s)
            self.env.timeout(done - now).callbacks.append(lambda ev, src=src: self._send_done(src))
        self.n_done += 1
        push = self.ready_push()
        missing = self.missing
        by = self.where[t]
        for s in self.succ[self.succ_ptr[t]:self.succ_ptr[t + 1]]:
            missing[s] -= 1
            if missing[s] == 0:
                push(s, by)
