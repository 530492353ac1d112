"""Main memory of limited capacity, with StarPU's eviction to a disk node: the forecast of a memory-limited step.

Under ``--memory-limit`` with ``--offload-dir`` every tile is StarPU's (home
node -1), main memory holds at most the limit of them, and StarPU evicts
tiles to a disk node when an allocation does not fit. The model, rule by rule,
with the StarPU 1.3.10 code each follows:

- **Capacity.** Main memory (node 0) holds at most ``limit_bytes`` of tiles
  (``STARPU_LIMIT_CPU_MEM``; ``src/datawizard/memory_manager.c``,
  ``_starpu_memory_manager_can_allocate_size``); the disk node is unbounded.
- **When an allocation does not fit, StarPU first reuses the memory of the
  least recently used clean tile of the same size** that no running task
  holds (``src/datawizard/memalloc.c``, ``_starpu_allocate_interface`` ->
  ``try_to_reuse_potentially_in_use_mc``: same footprint, in ``mc_list``
  order; ``try_to_throw_mem_chunk`` refuses a dirty one for reuse), with no
  transfer. **Else it reclaims twice the tile's size** (``reclaim =
  starpu_memstrategy_data_size_coefficient * handle_size``, the coefficient
  is 2, or what the allocation lacks if that is more), in the allocating
  worker, before the task's data can arrive.
- **Victims in least-recently-used order, skipping tiles in use**
  (``_starpu_memory_reclaim_generic`` -> ``free_potentially_in_use_mc`` walks
  ``mc_list`` from its head; ``_starpu_memchunk_recently_used`` moves a tile to
  the tail when a task uses it; ``try_to_throw_mem_chunk`` skips a tile a
  running task holds: ``may_free_subtree``).
- **Dirty tiles are written back to the disk first, clean ones dropped**
  (``try_to_throw_mem_chunk`` -> ``choose_target``: a tile with no home in main
  memory goes to the disk node; ``transfer_subtree_to_node``: the only valid
  copy (``STARPU_OWNER``) is fetched to the disk and waited for,
  ``_starpu_wait_data_request_completion``; a copy also valid on disk
  (``STARPU_SHARED``) is only invalidated). The allocating task waits for its
  write-backs.
- **Prefetches do not evict** (``_starpu_allocate_interface`` with
  ``is_prefetch``: it gives up when the cache and ``try_to_reuse_potentially_in_use_mc``
  free nothing, which skips tiles not marked ``wontuse``): a prefetch to a
  full main memory brings nothing and the data is fetched when the task starts.
  Memory-limited runs start StarPU without prefetches (``STARPU_PREFETCH=0``,
  :data:`tilecast.perfmodel.disk_node.LIMIT_PREFETCH`); with them, a failed
  prefetch is put back (``data_request.c``, ``-ENOMEM``) and tried again at
  every turn of every worker's progress loop, each try walking the whole
  ``mc_list`` three times under ``mc_lock``: that cost, which grows with the
  tiles main memory holds, is charged to each disk transfer as ``walk_s`` per
  tile held (:meth:`CappedMemory._disk_transfer`; fitted, docs/memory.md).
  A run without prefetches is simulated without any (``CappedMemory.prefetches``):
  its tasks fetch every missing tile when they start, and wait for it.
- **StarPU's time in the worker.** Before a task starts, its worker spends
  StarPU's time on its acquisition: a cost per task and per tile allocated,
  read back, written back and evicted clean, and per byte read and written back
  (``DiskNode.worker_costs``, :meth:`CappedMemory._worker_cost`), fitted by
  ``tilecast calibrate`` on probe steps from the tasks' measured delays
  (:mod:`tilecast.loop.disk_fit`), those of the step's own worker count where
  it ran the probes on it (``DiskNode.costs_for``: a tile read back costs far
  more with every core polled by a worker), and on a probe of the step's own
  tile size where ``calibrate`` ran one (a read back of a large tile costs
  more than the standard probes' small ones show); the events are counted per
  task (:meth:`CappedMemory.task_events`). Each tile a search for a tile to
  reuse walks past costs the allocating worker ``walk_tile_s``
  (``DiskNode.walk_tile_s``, timed by ``calibrate`` on StarPU alone:
  :mod:`tilecast.loop.walk_probe`): the one cost here that grows with the
  tiles main memory holds; the simulated searches walk longer than StarPU's,
  at a per-tile cost below a step's (docs/memory.md, 2026-12-05).
- **The disk traffic's computing time.** StarPU's CPU workers poll while
  their tiles are in transfer (``src/drivers/cpu/driver_cpu.c``,
  ``_starpu_cpu_driver_run_once``), so with as many workers as cores the page
  cache's work (glibc's AIO helpers' copies, the flusher's write-back) runs on
  their cores. Each byte written to the disk node or read from the page
  cache, and each second the device spends on a read that misses it, costs
  the computing time ``tilecast calibrate`` measured beside busy threads
  (``DiskNode.io_cpu_*``, :mod:`tilecast.perfmodel.io_cpu`); the step's sum so
  far is shared evenly by the workers, each paying what it owes before its
  next task starts (:func:`io_share`: nothing where a core is left free).
- **A read of a tile held only on disk copies it back** over the disk link, and
  both copies stay valid (shared) until a task writes it, which drops the disk
  copy (the coherency protocol, ``src/datawizard/coherency.c``).
- **The disk link** carries write-backs and reads one at a time
  (:class:`DiskLinks`, one timeline for both directions: one device), each
  taking ``latency + bytes / bandwidth`` as ``tilecast calibrate`` measured it
  (:mod:`tilecast.perfmodel.disk_node`), plus StarPU's own cost per transfer
  (fitted: not the file system's, nor glibc's AIO, docs/memory.md). Where
  ``calibrate`` also measured the device under the page cache (O_DIRECT), a
  transfer takes what the page cache in front of it says
  (:class:`tilecast.perfmodel.page_cache.CachedDisk`): the cache's speed
  while the written tiles' dirty pages stay under Linux's ``dirty_ratio`` and
  the tiles read back are still cached, the device's beyond.
- **Submission is throttled** (:class:`Throttled`; ``src/core/task.c``,
  ``_starpu_task_submit``: before a task is submitted, if more than
  ``STARPU_LIMIT_MAX_SUBMITTED_TASKS`` are submitted and not finished, wait
  until at most ``STARPU_LIMIT_MIN_SUBMITTED_TASKS`` remain), with the executor's
  16 and 8 per worker (:data:`tilecast.executor.starpu_session.THROTTLE_PER_WORKER`):
  a task unsubmitted is unknown to the scheduler even when its inputs are ready.
- **The step is a later one.** Tiles stay registered from step to step, so a
  step starts where the previous one left them: :func:`simulate_memory_limited`
  simulates a warm-up step first (persistent tiles in main memory up to the
  limit, the rest on disk, as after loading them in order), then the step it
  reports, from the warm-up's final placement and LRU order.

- **Tidying** (``starpu_memchunk_tidy``, at every driver progress): when
  fewer than 5% of main memory's tiles are clean, dirty ones are written back
  ahead of need, least recently used first, until 10% are; no task waits for
  these write-backs, but they hold the disk.

Not modelled: host-side acquires between steps (loss, batch), and the time
StarPU spends walking its lists other than for failed prefetches.

The Python engine's general loop runs it (the fused and C loops model
device memory only: :meth:`DequeModel.fused_run` leaves a Memory subclass to
the general loop, and :func:`simulate_memory_limited` does not call the C
loop); their results for ordinary simulations are unchanged.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, replace

import numpy as np

from tilecast.perfmodel.machine import Link, MemoryNode
from tilecast.simulator import gap_cost
from tilecast.simulator.engine import Engine, SimulationError
from tilecast.simulator.links import Links
from tilecast.simulator.memory import Memory
from tilecast.simulator.policies.base import Policy
from tilecast.simulator.simulate import SimResult
from tilecast.trace import with_disk_counters

@dataclass(frozen=True)
class MemoryForecast:
    """A main-memory limit to forecast under: ``limit_bytes`` and the disk node's figures (None: no disk
    node, every tile must fit under the limit)."""

    limit_bytes: int
    disk: object = None  # tilecast.perfmodel.disk_node.DiskNode
    #: the page cache in front of the disk node's device (tilecast.perfmodel.page_cache.PageCache); None: what
    #: this machine leaves the run, where the disk node's device was measured
    page_cache: object = None

    def refusal(self, graphs, workers: int) -> str | None:
        """Why the limit cannot run ``graphs`` on ``workers`` workers, in one line (None: it can); the same
        rule as the executor's (:func:`tilecast.graph.working_set.refusal`)."""
        from tilecast.graph.working_set import refusal

        return refusal(graphs, workers, self.limit_bytes, self.disk is not None)


#: StarPU 1.3.10 memalloc.c: starpu_memstrategy_data_size_coefficient
RECLAIM_FACTOR = 2
DISK_NODE = "disk"


def with_disk(machine, limit_bytes: int, disk):
    """``machine`` with main memory (node 0) limited to ``limit_bytes`` and a disk node linked to it with
    ``disk``'s (:class:`tilecast.perfmodel.disk_node.DiskNode`) figures: the disk node is the last node."""
    nodes = [replace(machine.nodes[0], capacity=float(limit_bytes))] + list(machine.nodes[1:])
    nodes.append(MemoryNode(DISK_NODE, "disk", float("inf")))
    host = machine.nodes[0].name
    links = list(machine.links) + [
        Link(f"disk-write:{host}->{DISK_NODE}", host, DISK_NODE, disk.write_bandwidth,
             disk.write_latency + disk.runtime_latency),
        Link(f"disk-read:{DISK_NODE}->{host}", DISK_NODE, host, disk.read_bandwidth,
             disk.read_latency + disk.runtime_latency)]
    return replace(machine, nodes=nodes, links=links, meta=dict(machine.meta))


class LimitedSimResult(SimResult):
    """A memory-limited step's result: its trace records the step's disk traffic
    (:func:`tilecast.trace.with_disk_counters`)."""

    def trace(self):
        s = self.summary
        return with_disk_counters(
            super().trace(), written_bytes=s["disk_written_bytes"], read_bytes=s["disk_read_bytes"],
            writes=s["disk_writes"], reads=s["disk_reads"], evictions=s["evictions"], writebacks=s["writebacks"],
            dropped=s["dropped"], tidied=s["tidied"])


class DiskLinks(Links):
    """Links where both directions of the disk share one timeline (one device: a read waits for the
    write-backs issued before it, and the other way round). With ``cache`` (a
    :class:`~tilecast.perfmodel.page_cache.CachedDisk`) a disk transfer takes what the page cache in front of
    the device says, plus StarPU's constant cost per transfer (``runtime_latency``), instead of the link's
    figures; a write's wait for the write-back (past Linux's dirty threshold) does not hold the link. ``node``: the
    :class:`~tilecast.perfmodel.disk_node.DiskNode` whose ``io_cpu_*`` figures add up the traffic's computing
    time in :attr:`io_cpu` (none without it)."""

    def __init__(self, machine, cache=None, runtime_latency: float = 0.0, node=None):
        super().__init__(machine)
        names = [ln.name for ln in machine.links]
        disk = [i for i, ln in enumerate(machine.links) if DISK_NODE in (ln.src, ln.dst)]
        self.timeline = list(range(len(names)))
        for i in disk:
            self.timeline[i] = disk[0]
        self.extra = 0.0  # seconds added to the next transfer (StarPU's cost that CappedMemory sets)
        self.cache, self.runtime_latency = cache, runtime_latency
        self.disk_node = len(machine.nodes) - 1
        self.tile = -1  # the tile of the next disk transfer (CappedMemory sets it; the page cache tracks tiles)
        # computing seconds the disk traffic takes from workers that fill the cores (DiskNode.io_cpu_*: per byte
        # written, per second of a device read, per byte read from the cache), and their sum over the transfers so
        # far (CappedMemory charges it to the workers)
        self.cpu_write = float(getattr(node, "io_cpu_write", 0.0) or 0.0)
        self.cpu_read = float(getattr(node, "io_cpu_read", 0.0) or 0.0)
        self.cpu_hit = float(getattr(node, "io_cpu_hit", 0.0) or 0.0)
        self.io_cpu = 0.0

    def transfer(self, src: int, dst: int, nbytes: int, not_before: float) -> float:
        route = self.route[src][dst]
        free_at, tl = self.free_at, self.timeline
        start = not_before
        for i in route:
            if free_at[tl[i]] > start:
                start = free_at[tl[i]]
        cache = self.cache
        busy_until = -1.0
        if cache is not None and dst == self.disk_node:
            waited = cache.throttled_s
            end = start + self.runtime_latency + cache.write(self.tile, nbytes, start) + self.extra
            # a writer waiting for the write-back (balance_dirty_pages) sleeps: the device meanwhile writes back
            # (the flusher's rate, in the cache's model) and serves the reads, which do not queue behind it
            busy_until = end - (cache.throttled_s - waited)
            self.io_cpu += self.cpu_write * nbytes
        elif cache is not None and src == self.disk_node:
            end = start + self.runtime_latency + cache.read(self.tile, nbytes, start) + self.extra
            self.io_cpu += self.cpu_hit * nbytes if cache.last_hit else self.cpu_read * cache.last_device_s
        else:
            end = start + self.latency[src][dst] + nbytes * self.inv_bw[src][dst] + self.extra
            if dst == self.disk_node:
                self.io_cpu += self.cpu_write * nbytes
            elif src == self.disk_node:  # no device measured: every read is the cache's
                self.io_cpu += self.cpu_hit * nbytes
        held = end if busy_until < 0.0 else busy_until
        for i in route:
            free_at[tl[i]] = held
        self.flat_log.extend((src, dst, nbytes, start, end))
        return end


class CappedMemory(Memory):
    """:class:`~tilecast.simulator.memory.Memory` with main memory limited and evicting to the disk node
    (the machine's last node; see the module's docstring for the rules)."""

    def __init__(self, graph, machine, links, limit_bytes: int, tidy: bool = True, prefetches: bool = False):
        super().__init__(graph, machine, links)
        self.prefetches = prefetches  # whether the run prefetches (STARPU_PREFETCH=1); memory-limited runs do not
        self.disk = len(machine.nodes) - 1
        self.capacity[0] = float(limit_bytes)
        self.tidy = tidy
        self.disk_written = 0  # bytes written back to the disk node
        self.disk_read = 0  # bytes read from it
        self.n_dropped = 0  # clean tiles evicted without a write
        self.n_tidied = 0  # dirty tiles written back ahead of need
        self.n_disk_reads = 0  # tiles read back from the disk node
        # StarPU's list walks as simulated, to set beside a run's (benchmarks/starpu_walk.py): searches for a tile
        # to reuse and the tiles they walked past or took, tidying passes and the tiles they looked at
        self.reuse_searches = self.reuse_walked = self.tidy_passes = self.tidy_walked = 0
        self.walk_s = 0.0  # StarPU's time per disk transfer and tile held in main memory (DiskNode.walk_s)
        self.walk_tile_s = 0.0  # StarPU's time per tile walked in a search for a tile to reuse (DiskNode.walk_tile_s)
        self.worker_costs = {}  # StarPU's time per task and per acquisition event, s (DiskNode.worker_costs)
        self.resident_sum = 0  # tiles held in main memory, summed over the disk transfers
        # the share of the disk traffic's computing time (DiskLinks.io_cpu) each worker pays, and what each has paid
        self.io_share = 0.0
        self.io_paid = {}
        self.worker = -1  # the worker whose task is being acquired (the engine sets it)
        # persistent tiles as the host loaded them one at a time: the last ones loaded in main memory (the
        # earlier ones evicted first, in LRU order), the others on disk
        held, disk_bit = self.avail[0], 1 << self.disk
        keep = 0
        for tile in reversed(list(held)):
            if keep + self.size[tile] <= limit_bytes:
                keep += self.size[tile]
            else:
                del held[tile]
                self.avail[self.disk][tile] = 0.0
                self.valid[tile] = disk_bit
                self.used[self.disk] += self.size[tile]
        self.used[0] = keep
        self.peak = list(self.used)
        self.dirty = set(held)  # tiles whose only valid copy is in main memory (STARPU_OWNER there)
        self._new_task_events(graph.n_tasks)

    def _new_task_events(self, n_tasks: int) -> None:
        """Per task of the step, what its worker did in main memory before it could start (the events StarPU's
        costs are charged for, and fitted on: :mod:`tilecast.loop.disk_fit`): tiles allocated there,
        read back from the disk node, written back to it (waited for) and evicted clean (dropped or reused)."""
        self.task = -1  # the task whose data is being acquired; -1 (the last, spare entry): a prefetch's
        self.task_allocs = np.zeros(n_tasks + 1, np.int32)
        self.task_reads = np.zeros(n_tasks + 1, np.int32)
        self.task_writebacks = np.zeros(n_tasks + 1, np.int32)
        self.task_drops = np.zeros(n_tasks + 1, np.int32)
        self.task_walked = np.zeros(n_tasks + 1, np.int64)  # tiles its worker's searches for a tile to reuse walked
        self.task_read_bytes = np.zeros(n_tasks + 1, np.int64)
        self.task_writeback_bytes = np.zeros(n_tasks + 1, np.int64)
        self.task_wait = np.zeros(n_tasks + 1)  # seconds its worker waited for the disk transfers (reads, write-backs)
        self.task_cost = np.zeros(n_tasks + 1)  # seconds of StarPU's time charged to its worker (worker_costs)
        self.task_io = np.zeros(n_tasks + 1)  # seconds of the disk traffic's computing charged to its worker

    def task_events(self) -> dict:
        """Per task of the step: ``allocs``, ``reads``, ``writebacks``, ``drops`` (tiles), ``read_bytes``,
        ``writeback_bytes`` (see :meth:`_new_task_events`)."""
        return {"allocs": self.task_allocs[:-1], "reads": self.task_reads[:-1],
                "writebacks": self.task_writebacks[:-1], "drops": self.task_drops[:-1],
                "read_bytes": self.task_read_bytes[:-1], "writeback_bytes": self.task_writeback_bytes[:-1]}

    def next_step(self, links) -> None:
        """Start another step from this one's placement and LRU order: every copy ready at time 0 on
        ``links`` (fresh timelines), the counters at zero."""
        for held in self.avail:
            for tile in held:
                held[tile] = 0.0
        for r in self.running:
            r.clear()
        self.links = links
        self._cost.clear()
        self.peak = list(self.used)
        self.n_evictions = self.n_writebacks = self.n_dropped = self.n_tidied = self.n_disk_reads = 0
        self.reuse_searches = self.reuse_walked = self.tidy_passes = self.tidy_walked = 0
        self.resident_sum = 0
        self.disk_written = self.disk_read = 0
        self.io_paid = {}
        self._new_task_events(len(self.task_allocs) - 1)

    def _make_room(self, node: int, nbytes: int, now: float) -> float:
        """Evict from ``node`` (main memory) until ``nbytes`` fit; return when the room is free (after the
        write-backs, which the allocating worker waits for)."""
        cap = self.capacity[node]
        if node != 0:
            super()._make_room(node, nbytes, now)
            return now
        held = self.avail[node]
        ptr, code = self.acc_ptr, self.acc_code
        in_use = {c >> 2 for t in self.running[node] for c in code[ptr[t]:ptr[t + 1]]}
        bit, disk, size, valid = 1 << node, self.disk, self.size, self.valid
        # memalloc.c, try_to_reuse_potentially_in_use_mc: the LRU clean tile of the same size, if any, gives
        # its memory (a dirty one is not taken for reuse: try_to_throw_mem_chunk with a replicate)
        self.reuse_searches += 1
        walked, taken = len(held), False
        for k, tile in enumerate(held):
            if size[tile] == nbytes and valid[tile] != bit and tile not in in_use:
                walked, taken = k + 1, True
                del held[tile]
                self.used[node] -= nbytes  # used <= cap held before, so the new tile now fits
                valid[tile] &= ~bit
                self.n_evictions += 1
                self.n_dropped += 1
                self.task_drops[self.task] += 1
                break
        self.reuse_walked += walked
        self.task_walked[self.task] += walked
        if taken:
            return now
        # memalloc.c, _starpu_allocate_interface: reclaim = 2 x the tile, at least what is lacking
        need = max(RECLAIM_FACTOR * nbytes, self.used[node] + nbytes - cap)
        victims = []
        for tile in held:  # LRU first (free_potentially_in_use_mc walks mc_list from its head)
            if tile in in_use:
                continue
            victims.append(tile)
            need -= self.size[tile]
            if need <= 0:
                break
        if self.used[node] - sum(self.size[t] for t in victims) + nbytes > cap:
            raise SimulationError(
                f"main memory ({cap / 2**20:.0f} MiB) cannot hold the data of the tasks running in it: the "
                f"limit is below the step's working set")
        free_at = now
        for tile in victims:
            ready = held.pop(tile)
            self.dirty.discard(tile)
            sz = size[tile]
            self.used[node] -= sz
            self.n_evictions += 1
            if self.valid[tile] == bit:  # the only valid copy (STARPU_OWNER): written to the disk, waited for
                end = self._disk_transfer(node, disk, sz, ready if ready > now else now, tile)
                self.valid[tile] = 1 << disk
                self.avail[disk][tile] = end
                self.used[disk] += sz
                self.disk_written += sz
                self.n_writebacks += 1
                self.task_writebacks[self.task] += 1
                self.task_writeback_bytes[self.task] += sz
                if end > free_at:
                    free_at = end
            else:  # also valid elsewhere (STARPU_SHARED): dropped
                self.valid[tile] &= ~bit
                self.n_dropped += 1
                self.task_drops[self.task] += 1
        return free_at

    def _disk_transfer(self, src: int, dst: int, nbytes: int, start: float, tile: int = -1) -> float:
        """A transfer of ``tile`` to or from the disk node, with StarPU's cost that grows with the tiles main
        memory holds (``walk_s`` per tile: its walks of ``mc_list``, docs/memory.md)."""
        n = len(self.avail[0])
        self.resident_sum += n
        self.links.extra = self.walk_s * n
        self.links.tile = tile
        end = self.links.transfer(src, dst, nbytes, start)
        self.links.extra = 0.0
        return end

    def _bring(self, tile: int, node: int, now: float, fetch: int = 1) -> float:
        size = self.size[tile]
        room = now
        if self.used[node] + size > self.capacity[node]:
            room = self._make_room(node, size, now)
        v = self.valid[tile]
        if v and fetch:
            src = v.bit_length() - 1 if v & (v - 1) == 0 else self._source(v, node, size)
            since = self.avail[src][tile]
            start = since if since > room else room
            if src == self.disk:
                ready = self._disk_transfer(src, node, size, start, tile)
                self.disk_read += size
                self.n_disk_reads += 1
                self.task_reads[self.task] += 1
                self.task_read_bytes[self.task] += size
            else:
                ready = self.links.transfer(src, node, size, start)
        else:
            ready = room  # a write-only access: allocated, nothing copied
        if node == 0:
            self.task_allocs[self.task] += 1
        self.avail[node][tile] = ready
        self.valid[tile] = v | (1 << node)
        u = self.used[node] + size
        self.used[node] = u
        if u > self.peak[node]:
            self.peak[node] = u
        return ready

    def acquire(self, task: int, node: int, now: float) -> float:
        """:meth:`Memory.acquire`, keeping track of main memory's dirty tiles, then StarPU's tidying."""
        self.task = task
        ready = super().acquire(task, node, now)
        self.task = -1
        if node == 0:
            if ready > now:
                self.task_wait[task] = ready - now
            if self.worker_costs or self.walk_tile_s:
                cost = self._worker_cost(task)
                self.task_cost[task] = cost
                ready = (ready if ready > now else now) + cost
            if self.io_share:
                owed = self.links.io_cpu * self.io_share - self.io_paid.get(self.worker, 0.0)
                if owed > 0.0:
                    self.io_paid[self.worker] = self.io_paid.get(self.worker, 0.0) + owed
                    self.task_io[task] = owed
                    ready = (ready if ready > now else now) + owed
            valid, dirty = self.valid, self.dirty
            for c in self.acc_code[self.acc_ptr[task]:self.acc_ptr[task + 1]]:
                if valid[c >> 2] == 1:  # written here (or new here): the only valid copy
                    dirty.add(c >> 2)
            if self.tidy:
                self._tidy(now)
        return ready

    def _worker_cost(self, task: int) -> float:
        """StarPU's time in the task's worker before the task starts, beyond the transfers themselves: a cost per
        task under the limit and per event of its acquisition (``worker_costs``, fitted by ``tilecast calibrate``
        on probe steps: :mod:`tilecast.loop.disk_fit`), and per tile its searches for a tile to reuse walked past
        (``walk_tile_s``, which ``calibrate`` times apart: :mod:`tilecast.loop.walk_probe`)."""
        c = self.worker_costs
        return (c.get("per_task", 0.0) + self.walk_tile_s * int(self.task_walked[task])
                + c.get("allocs", 0.0) * int(self.task_allocs[task])
                + c.get("reads", 0.0) * int(self.task_reads[task])
                + c.get("writebacks", 0.0) * int(self.task_writebacks[task])
                + c.get("drops", 0.0) * int(self.task_drops[task])
                + c.get("read_bytes", 0.0) * int(self.task_read_bytes[task])
                + c.get("writeback_bytes", 0.0) * int(self.task_writeback_bytes[task]))

    def _tidy(self, now: float) -> None:
        """memalloc.c, starpu_memchunk_tidy (run at every driver progress): when fewer than
        STARPU_MINIMUM_CLEAN_BUFFERS (5) % of main memory's tiles are clean, write dirty ones back to the disk,
        least recently used first, skipping those in use, until STARPU_TARGET_CLEAN_BUFFERS (10) % are; the
        write-backs are idle requests: no task waits for them, but they hold the disk."""
        held, dirty = self.avail[0], self.dirty
        n = len(held)
        clean = n - len(dirty)
        if clean >= (n * 5) // 100:
            return
        target = (n * 10) // 100
        ptr, code = self.acc_ptr, self.acc_code
        in_use = {c >> 2 for t in self.running[0] for c in code[ptr[t]:ptr[t + 1]]}
        disk, size, valid = self.disk, self.size, self.valid
        self.tidy_passes += 1
        for tile, ready in held.items():
            if clean >= target:
                break
            self.tidy_walked += 1
            if tile not in dirty or tile in in_use:
                continue
            sz = size[tile]
            end = self._disk_transfer(0, disk, sz, ready if ready > now else now, tile)
            valid[tile] |= 1 << disk
            self.avail[disk][tile] = end
            self.used[disk] += sz
            self.disk_written += sz
            self.n_tidied += 1
            dirty.discard(tile)
            clean += 1

    def prefetch(self, task: int, node: int, now: float) -> None:
        """Bring the task's inputs that fit without evicting (a prefetch never evicts in StarPU 1.3.10); nothing
        when the run does not prefetch (``STARPU_PREFETCH=0``, as memory-limited runs start): the task's worker
        then fetches every tile when it starts the task, and waits for it."""
        if not self.prefetches:
            return
        valid, cap, size = self.valid, self.capacity[node], self.size
        for tile in self.read_tile[self.read_ptr[task]:self.read_ptr[task + 1]]:
            if not (valid[tile] >> node) & 1 and self.used[node] + size[tile] <= cap:
                self._bring(tile, node, now)


class Throttled(Policy):
    """A policy seeing only submitted tasks: ``high`` and ``low`` are StarPU's
    ``STARPU_LIMIT_MAX_SUBMITTED_TASKS`` and ``..._MIN_...`` (src/core/task.c, ``_starpu_task_submit``).
    Tasks are submitted in id order (the executor's order)."""

    def __init__(self, inner: Policy, high: int, low: int):
        self.inner, self.high, self.low = inner, int(high), int(low)
        self.name = inner.name

    def attach(self, engine) -> None:
        self.engine = engine
        self.inner.attach(engine)
        self.done = 0
        self.submitted = 0

    def submit(self) -> None:
        self.inner.submit()
        # submit until more than `high` are in flight; the engine pushes the ready ones among them
        self.submitted = min(self.engine.n_tasks, self.high + 1)

    def fused_run(self) -> bool:
        return False

    def push(self, task: int, by: int) -> None:
        if task < self.submitted:
            self.inner.push(task, by)  # else: pushed when submitted (it is ready by then)

    def pop(self, worker: int) -> int:
        return self.inner.pop(worker)

    def started(self, task: int, worker: int, begin: float) -> None:
        self.inner.started(task, worker, begin)

    def finished(self, task: int, worker: int) -> None:
        self.inner.finished(task, worker)
        self.done += 1
        n, missing = self.engine.n_tasks, self.engine.missing
        if self.submitted >= n or self.submitted - self.done > self.low:
            return  # the submitting thread still waits (or has submitted everything)
        while self.submitted < n and self.submitted - self.done <= self.high:
            t = self.submitted
            self.submitted += 1
            if missing[t] == 0:
                self.inner.push(t, -1)


def io_share(disk, workers: int) -> float:
    """The share of the disk traffic's computing time (``DiskNode.io_cpu_*``, measured beside as many computing
    threads as the machine has cores) each of ``workers`` polling workers pays: ``1 / workers`` where they fill the
    cores it was measured beside (the page cache's work then runs on their cores), else 0 (it runs on a free
    core)."""
    busy = int(getattr(disk, "io_cpu_busy", 0) or 0)
    return 1.0 / workers if busy and workers >= busy else 0.0


def simulate_memory_limited(graph, machine, limit_bytes: int, disk, sched: str = "dmda", durations=None,
                            calibration=None, priority=None, seed: int = 0, throttle=(16, 8),
                            warmup: bool = True, tidy: bool = True, prefetches: bool | None = None,
                            page_cache=None):
    """Simulate a step of ``graph`` under a main-memory limit with a disk node (``disk``: a
    :class:`~tilecast.perfmodel.disk_node.DiskNode`); returns a
    :class:`~tilecast.simulator.simulate.SimResult` of the step after ``warmup`` warm-up steps (True: one),
    whose summary adds ``memory_limit_bytes``, ``disk_written_bytes``, ``disk_read_bytes``,
    ``dropped`` (clean evictions), ``tidied`` (tiles written back ahead of need), ``disk_writes`` and
    ``disk_reads`` (transfers to and from the disk node, tiles) and ``warmup_makespan_s``; its trace records
    the disk counters (:func:`tilecast.trace.with_disk_counters`).
    ``throttle``: tasks in flight per worker (max, min), or None; ``tidy``: model StarPU's tidying;
    ``prefetches``: whether the run prefetches (None: as a memory-limited run started from this environment
    would, :func:`tilecast.perfmodel.disk_node.limit_prefetches`; by default it does not).
    ``page_cache``: the page cache in front of the disk's device (a
    :class:`~tilecast.perfmodel.page_cache.PageCache`; None: what this machine leaves a process holding the
    limit, :func:`~tilecast.perfmodel.page_cache.page_cache_for`), used where ``disk`` has the device's figures
    (``DiskNode.has_device``): transfers then go through :class:`~tilecast.perfmodel.page_cache.CachedDisk`, and
    the summary adds its read hits and misses, and the seconds writers waited for write-back."""
    from tilecast.perfmodel.disk_node import limit_prefetches
    from tilecast.graph import priorities as _prio
    from tilecast.simulator.simulate import (POLICIES, USES_ESTIMATES, USES_PRIORITIES, summarize,
                                             task_priorities)

    if sched not in POLICIES:
        raise ValueError(f"unknown scheduling policy {sched!r} (known: {', '.join(POLICIES)})")
    if durations is None:
        from tilecast.perfmodel.kernel_model import DurationModel
        durations = DurationModel(machine, calibration).durations(graph)
    durations = np.atleast_2d(np.asarray(durations, dtype=np.float64))
    m = with_disk(machine, limit_bytes, disk)
    pred_ptr, pred = graph.dependencies
    if priority is None and sched in USES_PRIORITIES:
        priority = task_priorities(durations + m.task_overhead, pred_ptr, pred, sched)
    estimate = _prio.footprint_means(durations, _prio.footprint_groups(graph)) if sched in USES_ESTIMATES else None
    kind_index = {k: i for i, k in enumerate(m.kind_names)}
    worker_kind = [kind_index[w.kind] for w in m.workers]
    worker_node = [w.node for w in m.workers]
    cache = None
    if getattr(disk, "has_device", False):
        from tilecast.perfmodel.page_cache import CachedDisk, page_cache_for, run_process_bytes

        if page_cache is None:
            page_cache = page_cache_for(run_process_bytes(limit_bytes, graph.n_tiles))
        cache = CachedDisk(disk, page_cache)
    links = DiskLinks(m, cache, disk.runtime_latency, disk)
    memory = CappedMemory(graph, m, links, limit_bytes, tidy,
                          limit_prefetches() if prefetches is None else bool(prefetches))
    memory.walk_s = float(getattr(disk, "walk_s", 0.0))
    memory.walk_tile_s = float(getattr(disk, "walk_tile_s", 0.0))
    if hasattr(disk, "costs_for"):
        from tilecast.perfmodel.disk_node import typical_tile_bytes

        costs = disk.costs_for(len(m.workers), typical_tile_bytes(graph.tile_nbytes))
    else:
        costs = getattr(disk, "worker_costs", None)
    memory.worker_costs = {k: float(v) for k, v in (costs or {}).items()}
    memory.io_share = io_share(disk, len(m.workers))
    collecting = gc.isenabled()
    gc.disable()
    try:
        warm = None
        for step in range(1 + int(warmup)):
            if step:
                links = DiskLinks(m, cache, disk.runtime_latency, disk)
                memory.next_step(links)
                if cache is not None:
                    cache.next_step(eng.makespan)
            policy = POLICIES[sched](priority, seed, estimate)
            if throttle:
                n_w = len(m.workers)
                policy = Throttled(policy, throttle[0] * n_w, throttle[1] * n_w)
            eng = Engine(durations, pred_ptr, pred, worker_kind, worker_node, policy,
                         overhead=m.task_overhead, memory=memory, decision_scan=m.decision_scan,
                         decision_lock=m.decision_lock, slices=m.submit_slices,
                         gap_ready=m.gap_ready, gap_handoff=m.gap_handoff, **dict(zip(("gap_before", "release"), gap_cost.charges(graph, m))))
            eng.fused_loops = False  # the general loop: the fused ones know nothing of a capped main memory
            eng.run()
            if warmup and not step:
                warm = eng.makespan
    finally:
        if collecting:
            gc.enable()
    start, end, worker = eng.arrays()
    tr = links.arrays()
    summary = summarize(graph, m, durations, worker_kind, start, end, worker, links, tr, memory, sched)
    summary.update({"memory_limit_bytes": int(limit_bytes), "disk_written_bytes": int(memory.disk_written),
                    "disk_read_bytes": int(memory.disk_read), "dropped": int(memory.n_dropped),
                    "tidied": int(memory.n_tidied), "resident_per_transfer": (
                        memory.resident_sum / max(memory.n_writebacks + memory.n_tidied + memory.n_disk_reads, 1)),
                    "disk_writes": int(memory.n_writebacks + memory.n_tidied), "disk_reads": int(memory.n_disk_reads),
                    "warmup_makespan_s": warm, "disk_node": disk.describe(),
                    "reuse_searches": memory.reuse_searches, "reuse_walked": memory.reuse_walked,
                    "reuse_walk_s": memory.walk_tile_s * memory.reuse_walked,
                    "tidy_passes": memory.tidy_passes, "tidy_walked": memory.tidy_walked})
    summary["allocations"] = int(memory.task_allocs.sum())
    summary["io_cpu_s"] = float(links.io_cpu)  # the step's disk traffic's computing time
    summary["io_cpu_charged_s"] = float(memory.task_io.sum())  # what of it the workers paid
    if cache is not None:
        summary.update(cache.summary(summary["makespan_s"]))
        summary["page_cache"] = page_cache.describe()
    res = LimitedSimResult(start, end, worker, summary, tr, graph, m)
    res.task_events = memory.task_events()  # per task: what its worker did in main memory before it started
    res.task_waits = memory.task_wait[:-1]  # per task: seconds its worker waited for disk transfers
    res.task_costs = memory.task_cost[:-1]  # per task: StarPU's time charged to its worker (worker_costs)
    res.task_io = memory.task_io[:-1]  # per task: the disk traffic's computing time charged to its worker
    return res
