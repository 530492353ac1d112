"""Data replicas on memory nodes, kept as StarPU keeps them.

- Node 0 (host RAM) is the backing store: tiles of persistent tensors
  (inputs, parameters, optimizer states...) start valid there; a tile that no
  node holds yet is allocated where it is first written, with no transfer.
- A task's reads fetch a replica to its node unless one is valid (or already on
  its way) there; several nodes may hold valid replicas at once (shared readers).
- A write makes the writer's replica the only valid one: the others are
  dropped and their memory freed.
- A node that is full evicts its least recently used replica that no running
  task holds; if that replica is the only valid copy (dirty) it is first written
  back to the host. Capacity is never exceeded on device nodes; the host is
  not limited (its peak is reported).
- Transfers come from the host when it holds a valid copy, else from the
  lowest-numbered node that does, and are reserved on :class:`~tilecast.simulator.links.Links`.
"""

from __future__ import annotations

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
        self.pins: list[dict] = [dict() for _ in range(n_nodes)]
        ptr = graph.acc_ptr.tolist()
        tiles = graph.acc_tile.astype(np.int64).tolist()
        modes = graph.acc_mode.astype(np.int64).tolist()
        # per task: accesses as a tuple of (tile, mode)
        self.accesses = [tuple(zip(tiles[ptr[i]:ptr[i + 1]], modes[ptr[i]:ptr[i + 1]])) for i in range(graph.n_tasks)]
        self.n_evictions = 0
        self.n_writebacks = 0

    # --- estimates (no state change) ----------------------------------------
    def penalty(self, task: int) -> list[float]:
        """Per node, the uncontended time to bring the task's missing inputs there."""
        n = self.n_nodes
        pen = [0.0] * n
        valid = self.valid
        size = self.size
        est = self.links.estimate
        for tile, mode in self.accesses[task]:
            if not mode & 1:
                continue
            v = valid[tile]
            if v == 0:
                continue
            src = 0 if v & 1 else (v & -v).bit_length() - 1
            b = size[tile]
            for d in range(n):
                if not (v >> d) & 1:
                    pen[d] += est(src, d, b)
        return pen

    # --- state changes --------------------------------------------------------
    def _make_room(self, node: int, nbytes: int, now: float) -> None:
        cap = self.capacity[node]
        if self.used[node] + nbytes <= cap:
            return
        held = self.avail[node]
        pins = self.pins[node]
        victims = []
        need = self.used[node] + nbytes - cap
        for tile in held:
            if tile in pins:
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

    def _bring(self, tile: int, node: int, now: float, fetch: bool = True) -> float:
        """Make a replica of ``tile`` valid on ``node``; return when it is there.

        With ``fetch`` False (a write-only access) the space is allocated but no data is copied.
        """
        held = self.avail[node]
        if tile in held:
            ready = held.pop(tile)
            held[tile] = ready  # most recently used
            return ready
        size = self.size[tile]
        self._make_room(node, size, now)
        v = self.valid[tile]
        if v and fetch:
            src = 0 if v & 1 else (v & -v).bit_length() - 1
            ready = self.links.transfer(src, node, size, max(now, self.avail[src][tile]))
        else:
            ready = now  # nothing to copy: first write allocates
        held[tile] = ready
        self.valid[tile] = v | (1 << node)
        self.used[node] += size
        if self.used[node] > self.peak[node]:
            self.peak[node] = self.used[node]
        return ready

    def prefetch(self, task: int, node: int, now: float) -> None:
        """Start bringing the task's inputs to ``node`` (done when a task is assigned early)."""
        for tile, mode in self.accesses[task]:
            if mode & 1 and not (self.valid[tile] >> node) & 1:
                try:
                    self._bring(tile, node, now)
                except SimulationError:
                    return  # no room now: the fetch at start will retry

    def acquire(self, task: int, node: int, now: float) -> float:
        """Pin the task's data on ``node``, fetching what is missing; return when all is there."""
        ready = now
        pins = self.pins[node]
        bit = 1 << node
        for tile, mode in self.accesses[task]:
            pins[tile] = pins.get(tile, 0) + 1
        for tile, mode in self.accesses[task]:
            t = self._bring(tile, node, now, mode & 1)
            if t > ready:
                ready = t
            if mode & 2:
                v = self.valid[tile] & ~bit
                d = 0
                while v:
                    if v & 1:
                        self.avail[d].pop(tile, None)
                        self.used[d] -= self.size[tile]
                    v >>= 1
                    d += 1
                self.valid[tile] = bit
        return ready

    def release(self, task: int, node: int, now: float) -> None:
        """Unpin the task's data; written replicas are ready from now."""
        pins = self.pins[node]
        held = self.avail[node]
        for tile, mode in self.accesses[task]:
            c = pins[tile] - 1
            if c:
                pins[tile] = c
            else:
                del pins[tile]
            if mode & 2:
                held[tile] = now
