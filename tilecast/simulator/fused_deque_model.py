"""The run loop of the deque-model policies (dm, dmda, dmdas), fused with data replicas and links.

It simulates exactly what :class:`~tilecast.simulator.engine.Engine` does with a
:class:`~tilecast.simulator.policies.deque_model.DequeModel` policy, a
:class:`~tilecast.simulator.memory.Memory` and its
:class:`~tilecast.simulator.links.Links`, step for step and in the same
floating-point order, so the results are equal bit for bit (tests compare the
two on random graphs and machines). The readable, general path stays in those
classes; this is the same model written as a few closures over local variables,
because on graphs of a million tasks Python's cost per call and per attribute
lookup is most of the simulation time. Differences in form only:

- a worker's penalty is summed over the workers' nodes, not every node, from
  per-(replica set, tile size) vectors cached once (all-zero ones skipped);
- a ready task given to an idle worker with an empty queue starts at once,
  bypassing the queue;
- the engine's idle set and done count are set once at the end.

The clock is still simpy's: one timeout event per task end, as in the engine.
"""

from __future__ import annotations

from heapq import heappop, heappush
from operator import add

from tilecast.simulator.engine import SimulationError


def run_deque_model(eng) -> None:
    """Run ``eng`` (an Engine whose policy is a DequeModel) to the end of its events."""
    pol = eng.policy
    mem = eng.memory
    env = eng.env
    timeout = env.timeout
    overhead = eng.overhead
    n_workers = eng.n_workers
    wnode = eng.worker_node
    rows = [eng.duration[k] for k in eng.worker_kind]  # per worker, duration of each task
    row0 = rows[0]
    one_kind = all(r is row0 for r in rows)
    busy, start, end, where = eng.busy, eng.start, eng.end, eng.where
    missing, succ, succ_ptr = eng.missing, eng.succ, eng.succ_ptr
    exp_end, exp_len, assigned = pol.exp_end, pol.exp_len, pol.assigned_len
    queues = pol.queues
    sorted_queues = pol.sorted_queues
    neg = pol.neg if pol.neg else None
    inf = float("inf")

    if mem is not None:
        links = mem.links
        valid, size, avail, used, peak, capacity = mem.valid, mem.size, mem.avail, mem.used, mem.peak, mem.capacity
        acc_ptr, acc_code = mem.acc_ptr, mem.acc_code
        read_ptr, read_tile = mem.read_ptr, mem.read_tile
        free_at = links.free_at
        log = links.flat_log.extend
        n_nodes = mem.n_nodes
        skey = [b << n_nodes for b in size]  # per tile, its size in the keys of the caches below
        # per destination node, (replica set, size) -> a copy plan (see copy_plan)
        src_cache: list[dict] = [dict() for _ in range(n_nodes)]
        node_workers = [[w for w in range(n_workers) if wnode[w] == nd] for nd in range(n_nodes)]
        cur = [-1] * n_workers  # the task each busy worker runs
    data_aware = pol.data_aware and mem is not None

    def copy_plan(v: int, nd: int, sz: int, key: int):
        """Where a copy of ``sz`` bytes held on nodes ``v`` to ``nd`` comes from, and its route and costs:
        (source, first link, last link, the route if longer than two links else None, latency,
        size / bottleneck bandwidth, route)."""
        src = mem._source(v, nd, sz)
        route = links.route[src][nd]
        # routes of one or two links (every shipped machine's) are unrolled: first and last link
        # (the same one twice for a single link: taking the max and reserving are idempotent)
        short = 1 <= len(route) <= 2
        plan = (src, route[0] if short else -1, route[-1] if short else -1, None if short else route,
                links.latency[src][nd], sz * links.inv_bw[src][nd], route)
        src_cache[nd][key] = plan
        return plan

    def make_room(nd: int, sz: int, now: float, acquiring: int) -> None:
        """Memory._make_room, its running set rebuilt from the busy workers (and the task acquiring data)."""
        on_node = {cur[w] for w in node_workers[nd] if busy[w]}
        if acquiring >= 0:
            on_node.add(acquiring)
        mem.running[nd] = on_node
        mem._make_room(nd, sz, now)
    data_aware = pol.data_aware and mem is not None

    # --- dmda's data penalty: per worker, uncontended time to fetch the task's missing inputs ---
    pen_cache: dict = {}
    pen_get = pen_cache.get
    ZERO = ()

    def tile_penalty(v: int, b: int):
        """Per worker, Memory's per-node tile cost for a tile of ``b`` bytes held on nodes ``v``."""
        per_node = mem._cost.get((v, b)) or mem._tile_cost(v, b)
        vec = [per_node[nd] for nd in wnode]
        vec = vec if any(vec) else ZERO
        pen_cache[(b << n_nodes) | v] = vec
        return vec

    # --- data replicas and transfers (Memory._bring, Memory.prefetch, Links.transfer) ---
    def bring(tile: int, nd: int, now: float, fetch: int, acquiring: int) -> float:
        sz = size[tile]
        if used[nd] + sz > capacity[nd]:
            make_room(nd, sz, now, acquiring)
        v = valid[tile]
        if v and fetch:
            key = skey[tile] | v
            plan = src_cache[nd].get(key) or copy_plan(v, nd, sz, key)
            src, _, _, _, lat, xfer, route = plan
            t0 = avail[src][tile]
            if t0 < now:
                t0 = now
            for i in route:
                if free_at[i] > t0:
                    t0 = free_at[i]
            ready = t0 + lat + xfer
            for i in route:
                free_at[i] = ready
            log((src, nd, sz, t0, ready))
        else:
            ready = now
        avail[nd][tile] = ready
        valid[tile] = v | (1 << nd)
        u = used[nd] + sz
        used[nd] = u
        if u > peak[nd]:
            peak[nd] = u
        return ready

    def prefetch(task: int, nd: int, now: float) -> None:
        """Memory.prefetch with _bring inlined (most transfers are issued here)."""
        bit = 1 << nd
        held = avail[nd]
        plans = src_cache[nd]
        cap = capacity[nd]
        for tile in read_tile[read_ptr[task]:read_ptr[task + 1]]:
            v = valid[tile]
            if v & bit:
                continue
            sz = size[tile]
            if used[nd] + sz > cap:
                try:
                    make_room(nd, sz, now, -1)
                except SimulationError:
                    return  # no room now: the fetch at start will retry
                v = valid[tile]
            if v:
                key = skey[tile] | v
                plan = plans.get(key) or copy_plan(v, nd, sz, key)
                src, first, last, long_route, lat, xfer, _ = plan
                t0 = avail[src][tile]
                if t0 < now:
                    t0 = now
                if long_route is None:
                    f = free_at[first]
                    if f > t0:
                        t0 = f
                    f = free_at[last]
                    if f > t0:
                        t0 = f
                    ready = t0 + lat + xfer
                    free_at[first] = ready
                    free_at[last] = ready
                else:
                    for i in long_route:
                        if free_at[i] > t0:
                            t0 = free_at[i]
                    ready = t0 + lat + xfer
                    for i in long_route:
                        free_at[i] = ready
                log((src, nd, sz, t0, ready))
            else:
                ready = now
            held[tile] = ready
            valid[tile] = v | bit
            u = used[nd] + sz
            used[nd] = u
            if u > peak[nd]:
                peak[nd] = u

    # --- the engine: start a task, end a task, give a ready task to a worker ---
    def begin(w: int, t: int) -> None:
        now = env._now
        b = now + overhead
        if mem is not None:  # Memory.acquire
            nd = wnode[w]
            cur[w] = t
            held = avail[nd]
            bit = 1 << nd
            ready = now
            for c in acc_code[acc_ptr[t]:acc_ptr[t + 1]]:
                tile = c >> 2
                r = held.pop(tile, None)
                if r is None:
                    r = bring(tile, nd, now, c & 1, t)
                else:
                    held[tile] = r  # most recently used
                if r > ready:
                    ready = r
                if c & 2:
                    v = valid[tile]
                    if v != bit:  # a write: drop every other replica
                        v &= ~bit
                        sz = size[tile]
                        while v:
                            low = v & -v
                            d = low.bit_length() - 1
                            del avail[d][tile]
                            used[d] -= sz
                            v ^= low
                        valid[tile] = bit
            if ready > b:
                b = ready
        e = b + rows[w][t]
        busy[w] = True
        start[t] = b
        end[t] = e
        where[t] = w
        timeout(e - now, t).callbacks.append(finish)

    def push(task: int) -> None:
        now = env._now
        pw = None  # Memory.penalty, per worker: non-zero tile costs summed in read order
        if data_aware:
            for tile in read_tile[read_ptr[task]:read_ptr[task + 1]]:
                v = valid[tile]
                if v:
                    vec = pen_get(skey[tile] | v)
                    if vec is None:
                        vec = tile_penalty(v, size[tile])
                    if vec is not ZERO:
                        pw = vec if pw is None else list(map(add, pw, vec))
        if one_kind:
            d = row0[task]
            if pw is None:
                f = [(e if e > now else now) + d for e in exp_end]
            else:
                f = [((e if e > now else now) + d) + p for e, p in zip(exp_end, pw)]
        else:
            if pw is None:
                f = [(e if e > now else now) + r[task] for e, r in zip(exp_end, rows)]
            else:
                f = [((e if e > now else now) + r[task]) + p for e, r, p in zip(exp_end, rows, pw)]
            d = None
        best = min(f)
        if best < inf:
            w = f.index(best)  # the lowest worker id among equals, as the policy's scan
        else:  # no finite choice, or a NaN first (min() would stop on it): the policy's own scan
            w, best = -1, inf
            for i, x in enumerate(f):
                if x < best:
                    w, best = i, x
            if w < 0:
                raise RuntimeError(f"task {task}: no worker can run it")
        if d is None:
            d = rows[w][task]
        e = exp_end[w]
        if e < now:
            e = now
        arrival = now + (pw[w] if pw is not None else 0.0)  # the worker cannot start before the data arrives
        length = d + overhead + (arrival - e if arrival > e else 0.0)
        exp_end[w] = e + length
        exp_len[w] += length
        assigned[task] = length
        q = queues[w]
        if q or busy[w]:
            if mem is not None:
                prefetch(task, wnode[w], now)
            if sorted_queues:
                heappush(q, (neg[task] if neg else 0.0, task))
            else:
                q.append(task)
            if not busy[w]:  # the worker that just ended a task, its successors being pushed
                begin(w, heappop(q)[1] if sorted_queues else q.popleft())
        else:
            begin(w, task)

    def finish(ev) -> None:
        t = ev._value
        w = where[t]
        busy[w] = False
        left = exp_len[w] - assigned[t]
        if left < 1e-15:
            left = 0.0
        exp_len[w] = left
        exp_end[w] = env._now + left
        for s in succ[succ_ptr[t]:succ_ptr[t + 1]]:
            m = missing[s] - 1
            missing[s] = m
            if not m:
                push(s)
        if not busy[w]:
            q = queues[w]
            if q:
                begin(w, heappop(q)[1] if sorted_queues else q.popleft())

    for t in [i for i, m in enumerate(missing) if m == 0]:
        push(t)
    env.run()
    eng.n_done = eng.n_tasks - where.count(-1)
    eng.idle = {w for w in range(n_workers) if not busy[w]}
    if mem is not None:
        mem.running = [set() for _ in range(n_nodes)]
