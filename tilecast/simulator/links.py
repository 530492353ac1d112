"""Transfers over links, reserved on per-link timelines.

Every link is serialized per direction (a full-duplex link is two directed
links): a transfer waits until every link of its route is free, then holds them
all for ``sum(latency) + bytes / bottleneck bandwidth``. A link that several
routes share (a PCIe switch's uplink, a host memory bus) therefore carries
their transfers one after another: the same throughput as fair sharing, with
first-come, first-served completion. Because a link's queue
is first come, first served, a transfer's end is known when it is issued, so no
simulation event is needed for it; the engine only learns when the data will be
there.
"""

from __future__ import annotations

import numpy as np


class Links:
    def __init__(self, machine):
        n = len(machine.nodes)
        self.n_links = len(machine.links)
        self.free_at = [0.0] * self.n_links
        self.bytes = [0] * self.n_links
        self.route = [[tuple(machine.routes[s][d] or ()) for d in range(n)] for s in range(n)]
        lat = np.zeros((n, n))
        inv_bw = np.zeros((n, n))
        first = np.full((n, n), -1, dtype=np.int64)
        for s in range(n):
            for d in range(n):
                r = machine.routes[s][d]
                if s != d and r:
                    lat[s, d] = sum(machine.links[i].latency for i in r)
                    inv_bw[s, d] = 1.0 / min(machine.links[i].bandwidth for i in r)
                    first[s, d] = r[0]
        self.latency = lat.tolist()
        self.inv_bw = inv_bw.tolist()
        self.first_link = first.tolist()
        self.log: list[tuple] = []  # (src, dst, bytes, start, end) per transfer

    def estimate(self, src: int, dst: int, nbytes: int) -> float:
        """Uncontended duration of a transfer (what a scheduler's bus model predicts)."""
        return self.latency[src][dst] + nbytes * self.inv_bw[src][dst]

    def transfer(self, src: int, dst: int, nbytes: int, not_before: float) -> float:
        """Reserve the route for a transfer that may start at ``not_before``; return its end."""
        route = self.route[src][dst]
        free_at = self.free_at
        start = not_before
        for i in route:
            if free_at[i] > start:
                start = free_at[i]
        end = start + self.latency[src][dst] + nbytes * self.inv_bw[src][dst]
        for i in route:
            free_at[i] = end
        self.log.append((src, dst, nbytes, start, end))
        return end

    def arrays(self) -> dict:
        """The transfers as arrays: src, dst, bytes, start, end."""
        if not self.log:
            z = np.zeros(0, dtype=np.int64)
            return {"src": z, "dst": z, "bytes": z, "start": np.zeros(0), "end": np.zeros(0)}
        a = np.array(self.log, dtype=np.float64)  # bytes and node ids are exact in float64
        return {"src": a[:, 0].astype(np.int64), "dst": a[:, 1].astype(np.int64), "bytes": a[:, 2].astype(np.int64),
                "start": a[:, 3].copy(), "end": a[:, 4].copy()}

    def bytes_per_link(self, arrays: dict | None = None) -> np.ndarray:
        """Bytes carried by each link (a transfer counts on every link of its route)."""
        out = np.zeros(self.n_links, dtype=np.int64)
        a = arrays if arrays is not None else self.arrays()
        if not len(a["bytes"]):
            return out
        n = len(self.route)
        per_pair = np.bincount(a["src"] * n + a["dst"], weights=a["bytes"], minlength=n * n)
        for pair in np.flatnonzero(per_pair):
            for i in self.route[pair // n][pair % n]:
                out[i] += int(per_pair[pair])
        return out
