"""Data replicas on memory nodes, kept as StarPU keeps them.

- Node 0 (host RAM) is the backing store: tiles of persistent tensors
  (inputs, parameters, optimizer states...) start valid there; a tile that no
  node holds yet is allocated where it is first written, with no transfer.
- A task's reads fetch a replica to its node unless one is valid (or already on
  its way) there; several nodes may hold valid replicas at once (shared readers).
- A write makes the writer's replica the only valid one: the others are
  dropped and their memory freed.
- A node that is full evicts its least recently used replica that no running
  task uses; if that replica is the only valid copy (dirty) it is first written
  back to the host. Capacity is never exceeded on device nodes; the host is
  not limited (its peak is reported).
- A transfer comes from the valid replica with the shortest uncontended copy
  time to the destination (as StarPU picks the source of a copy by its bus
  model; ties: lowest node), and is reserved on :class:`~tilecast.simulator.links.Links`.

Hot paths avoid per-access bookkeeping: the tiles in use on a node are found
from the tasks running there only when an eviction needs them.
"""

from __future__ import annotations

from operator import add

import numpy as np

from tilecast.simulator.engine import SimulationError


class Memory:
    def __init__(self, graph, machine, links):
        self.links = links
        n_nodes = len(machine.nodes)
        self.n_nodes = n_nodes
        self.capacity = [float("inf")] + [float(n.capacity) for n in machine.nodes[1:]]
        self.size = graph.tile_nbytes.astype(np.int64).tolist()
        persistent = graph.persistent_tiles()
        self.valid = np.where(persistent, 1, 0).astype(np.int64).tolist()  # bitmask of nodes
        self.avail: list[dict] = [dict() for _ in range(n_nodes)]  # tile -> time ready; insertion order = LRU
        self.avail[0] = {int(t): 0.0 for t in np.flatnonzero(persistent)}
        self.used = [0] * n_nodes
        self.used[0] = int(graph.tile_nbytes[persistent].sum())
        self.peak = list(self.used)
        self.running: list[set] = [set() for _ in range(n_nodes)]  # tasks holding data on each node
        ptr = graph.acc_ptr.tolist()
        tiles = graph.acc_tile.astype(np.int64).tolist()
        modes = graph.acc_mode.astype(np.int64).tolist()
        pairs = list(zip(tiles, modes))
        self.accesses = [tuple(pairs[ptr[i]:ptr[i + 1]]) for i in range(graph.n_tasks)]
        reads = [t for t, m in pairs if m & 1]
        rptr = np.zeros(graph.n_tasks + 1, dtype=np.int64)
        np.cumsum(np.add.reduceat((graph.acc_mode & 1).astype(np.int64), graph.acc_ptr[:-1])
                  if graph.n_tasks else np.zeros(0, np.int64), out=rptr[1:])
        rptr = rptr.tolist()
        self.reads = [tuple(reads[rptr[i]:rptr[i + 1]]) for i in range(graph.n_tasks)]
        self._cost: dict = {}
        self._zero = [0.0] * n_nodes
        self.n_evictions = 0
        self.n_writebacks = 0

    # --- estimates (no state change) ----------------------------------------
    def _source(self, v: int, dst: int, b: int) -> int:
        """The node holding a valid replica (bitmask ``v``) that copies ``b`` bytes to ``dst`` fastest."""
        if v & (v - 1) == 0:
            return v.bit_length() - 1
        est = self.links.estimate
        best, best_t = -1, float("inf")
        while v:
            low = v & -v
            s = low.bit_length() - 1
            t = est(s, dst, b)
            if t < best_t:
                best, best_t = s, t
            v ^= low
        return best

    def _tile_cost(self, v: int, b: int) -> list:
        """Per node, time to bring a tile of ``b`` bytes held on nodes ``v`` there (0 where held)."""
        est = self.links.estimate
        c = [0.0 if (v >> d) & 1 else est(self._source(v, d, b), d, b) for d in range(self.n_nodes)]
        self._cost[(v, b)] = c
        return c

    def penalty(self, task: int) -> list[float]:
        """Per node, the uncontended time to bring the task's missing inputs there."""
        valid, size, cache = self.valid, self.size, self._cost
        pen = None
        for tile in self.reads[task]:
            v = valid[tile]
            if v:
                b = size[tile]
                vec = cache.get((v, b)) or self._tile_cost(v, b)
                pen = vec if pen is None else list(map(add, pen, vec))
        return pen if pen is not None else self._zero

    # --- state changes --------------------------------------------------------
    def _make_room(self, node: int, nbytes: int, now: float) -> None:
        cap = self.capacity[node]
        if self.used[node] + nbytes <= cap:
            return
        held = self.avail[node]
        in_use = {tile for t in self.running[node] for tile, _ in self.accesses[t]}
        victims = []
        need = self.used[node] + nbytes - cap
        for tile in held:
            if tile in in_use:
                continue
            victims.append(tile)
            need -= self.size[tile]
            if need <= 0:
                break
        if need > 0:
            raise SimulationError(
                f"memory node {node} ({cap / 2**30:.3g} GiB) cannot hold the data of the tasks running on it")
        bit = 1 << node
        for tile in victims:
            ready = held.pop(tile)
            self.used[node] -= self.size[tile]
            self.n_evictions += 1
            if self.valid[tile] == bit:  # the only valid copy: write it back to the host first
                end = self.links.transfer(node, 0, self.size[tile], max(now, ready))
                self.valid[tile] = 1
                self.avail[0][tile] = end
                self.used[0] += self.size[tile]
                if self.used[0] > self.peak[0]:
                    self.peak[0] = self.used[0]
                self.n_writebacks += 1
            else:
                self.valid[tile] &= ~bit

    def _bring(self, tile: int, node: int, now: float, fetch: int = 1) -> float:
        """Make a replica of ``tile`` valid on ``node`` (not held there yet); return when it is there.

        With ``fetch`` 0 (a write-only access) the space is allocated but no data is copied.
        """
        size = self.size[tile]
        used = self.used
        if used[node] + size > self.capacity[node]:
            self._make_room(node, size, now)
        v = self.valid[tile]
        if v and fetch:
            src = v.bit_length() - 1 if v & (v - 1) == 0 else self._source(v, node, size)
            since = self.avail[src][tile]
            ready = self.links.transfer(src, node, size, since if since > now else now)
        else:
            ready = now  # nothing to copy
        self.avail[node][tile] = ready
        self.valid[tile] = v | (1 << node)
        u = used[node] + size
        used[node] = u
        if u > self.peak[node]:
            self.peak[node] = u
        return ready

    def prefetch(self, task: int, node: int, now: float) -> None:
        """Start bringing the task's inputs to ``node`` (done when a task is assigned early)."""
        valid = self.valid
        for tile in self.reads[task]:
            if not (valid[tile] >> node) & 1:
                try:
                    self._bring(tile, node, now)
                except SimulationError:
                    return  # no room now: the fetch at start will retry

    def acquire(self, task: int, node: int, now: float) -> float:
        """Hold the task's data on ``node``, fetching what is missing; return when all is there."""
        self.running[node].add(task)
        ready = now
        held = self.avail[node]
        valid = self.valid
        bit = 1 << node
        for tile, mode in self.accesses[task]:
            if tile in held:
                t = held.pop(tile)
                held[tile] = t  # most recently used
            else:
                t = self._bring(tile, node, now, mode & 1)
            if t > ready:
                ready = t
            if mode & 2 and valid[tile] != bit:
                v = valid[tile] & ~bit
                while v:  # drop every other replica
                    low = v & -v
                    d = low.bit_length() - 1
                    del self.avail[d][tile]
                    self.used[d] -= self.size[tile]
                    v ^= low
                valid[tile] = bit
        return ready

    def release(self, task: int, node: int, now: float) -> None:
        """The task ended: its data may be evicted again.

        Written replicas need no new ready time: every later reader or copy of
        them starts after this task ended (dependencies order them).
        """
        self.running[node].discard(task)
