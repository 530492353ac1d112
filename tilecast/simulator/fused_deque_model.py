# cython: boundscheck=False, wraparound=False, initializedcheck=False
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

The module is also valid Cython in pure-Python mode: :mod:`tilecast.simulator.compiled`
compiles it on first use (about 1.6x faster), and it runs interpreted where
Cython or a compiler is missing. The ``cython`` annotations type the hot
scalars and containers; they are never evaluated when the module runs
interpreted (``from __future__ import annotations``). Compiled, the CSR lists
are read as C arrays, and indices are not checked (the directives on the first
line): every index is a task, tile, worker, node or link id the model made
itself, and the interpreted module, which the tests run too, would raise on a
wrong one. Only the choice of a worker in ``push`` has two forms, a C loop
when compiled and list comprehensions when interpreted, both equal to the
policy's scan.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right, insort
from heapq import heappop, heappush
from operator import add

from tilecast.simulator.engine import SimulationError

try:
    import cython
except ImportError:  # interpreted without Cython installed: only this flag is read at run time
    class cython:  # noqa: N801
        compiled = False


COMPILED: bool = cython.compiled  # True in the Cython-built module


def _flat(values: list):
    """A list of ints as the loop reads it: a C array of int64 when compiled, the list itself when interpreted."""
    return array("q", values) if cython.compiled else values


def run_deque_model(eng) -> None:
    """Run ``eng`` (an Engine whose policy is a DequeModel) to the end of its events."""
    pol = eng.policy
    mem = eng.memory
    env = eng.env
    timeout = env.timeout
    overhead: cython.double = eng.overhead
    gap_before = eng.gap_before  # per task, or None (Engine.gap_before, Engine.release)
    release = eng.release
    gap_ready: cython.double = eng.gap_ready
    gap_handoff: cython.double = eng.gap_handoff
    made_by: cython.longlong[:] = eng.made_by  # Engine.made_by
    n_workers: cython.Py_ssize_t = eng.n_workers
    wnode: list = eng.worker_node
    rows: list = [eng.duration[k] for k in eng.worker_kind]  # per worker, duration of each task
    erows: list = [pol.rows[k] for k in eng.worker_kind]  # per worker, StarPU's estimate of each task
    row0: list = erows[0]
    one_kind: cython.bint = all(r is row0 for r in erows)
    busy: list = eng.busy
    start: cython.double[:] = eng.start  # array.array: typed views when compiled
    end: cython.double[:] = eng.end
    where: cython.longlong[:] = eng.where
    missing: list = eng.missing
    succ: cython.longlong[:] = _flat(eng.succ)
    succ_ptr: cython.longlong[:] = _flat(eng.succ_ptr)
    exp_start: list = pol.exp_start
    exp_len: list = pol.exp_len
    predicted: list = pol.predicted
    predicted_transfer: list = pol.predicted_transfer
    queues: list = pol.queues
    sorted_queues: cython.bint = pol.sorted_queues
    neg = pol.neg if pol.neg else None
    inf: cython.double = float("inf")
    has_mem: cython.bint = mem is not None
    pwc: cython.double[:] = None  # compiled push: the summed data penalty per worker
    endc: cython.double[:] = None  # compiled push: the task's expected end per worker
    if cython.compiled:
        pwc = array("d", [0.0] * n_workers)
        endc = array("d", [0.0] * n_workers)
    pushed = [0]  # sorted queues: equal priorities in push order
    # dmdas: sorted insertions charged to the pushing worker (Engine.walk), which pops its next task only after
    # pushing all that its ended task released
    push_walk: cython.double = eng.push_walk
    walk_far: cython.double = eng.walk_far
    walk_knee: cython.double = eng.walk_knee
    walking: cython.bint = sorted_queues and push_walk > 0.0
    hold: list = eng.hold
    keys: list = pol.keys
    pusher = [-1]
    wcache = eng.cache  # per-worker cache state (tilecast/simulator/worker_cache.py), or None

    # with data: Memory's and Links' own lists and dicts, shared (Memory._make_room updates them too)
    links = log = None
    valid: list = None
    size: list = None
    avail: list = None
    used: list = None
    peak: list = None
    capacity: list = None
    acc_ptr: cython.longlong[:] = None  # CSR lists: flat C arrays when compiled, else Memory's lists
    acc_code: cython.longlong[:] = None
    read_ptr: cython.longlong[:] = None
    read_tile: cython.longlong[:] = None
    free_at: list = None
    skey: list = None
    src_cache: list = None
    node_workers: list = None
    cur: list = None
    n_nodes: cython.Py_ssize_t = 0
    if has_mem:
        links = mem.links
        valid, size, avail, used, peak, capacity = mem.valid, mem.size, mem.avail, mem.used, mem.peak, mem.capacity
        acc_ptr, acc_code, read_ptr, read_tile = _flat(mem.acc_ptr), _flat(mem.acc_code), _flat(mem.read_ptr), _flat(mem.read_tile)
        free_at = links.free_at
        log = links.flat_log.extend
        n_nodes = mem.n_nodes
        skey = [b << n_nodes for b in size]  # per tile, its size in the keys of the caches below
        # per destination node, (replica set, size) -> a copy plan (see copy_plan)
        src_cache = [dict() for _ in range(n_nodes)]
        node_workers = [[w for w in range(n_workers) if wnode[w] == nd] for nd in range(n_nodes)]
        cur = [-1] * n_workers  # the task each busy worker runs
    data_aware: cython.bint = pol.data_aware and has_mem

    def copy_plan(v: int, nd: int, sz: int, key: int):
        """Where a copy of ``sz`` bytes held on nodes ``v`` to ``nd`` comes from, and its route and costs:
        (source, first link, last link, the route if longer than two links else None, latency,
        size / bottleneck bandwidth, route)."""
        src = mem._source(v, nd, sz)
        route = links.route[src][nd]
        # routes of one or two links (every shipped machine's) are unrolled: first and last link
        # (the same one twice for a single link: taking the max and reserving are idempotent)
        short = 1 <= len(route) <= 2
        plan = (src, route[0] if short else -1, route[len(route) - 1] if short else -1, None if short else route,
                links.latency[src][nd], sz * links.inv_bw[src][nd], route)
        src_cache[nd][key] = plan
        return plan

    def make_room(nd: cython.Py_ssize_t, sz: cython.longlong, now: cython.double,
                  acquiring: cython.Py_ssize_t) -> None:
        """Memory._make_room, its running set rebuilt from the busy workers (and the task acquiring data)."""
        on_node = {cur[w] for w in node_workers[nd] if busy[w]}
        if acquiring >= 0:
            on_node.add(acquiring)
        mem.running[nd] = on_node
        mem._make_room(nd, sz, now)

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
    def bring(tile: cython.Py_ssize_t, nd: cython.Py_ssize_t, now: cython.double, fetch: cython.longlong,
              acquiring: cython.Py_ssize_t) -> cython.double:
        sz: cython.longlong = size[tile]
        v: cython.longlong
        key: cython.longlong
        u: cython.longlong
        t0: cython.double
        ready: cython.double
        lat: cython.double
        xfer: cython.double
        src: cython.Py_ssize_t
        i: cython.Py_ssize_t
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

    def prefetch(task: cython.Py_ssize_t, nd: cython.Py_ssize_t, now: cython.double) -> None:
        """Memory.prefetch with _bring inlined (most transfers are issued here)."""
        j: cython.Py_ssize_t
        bit: cython.longlong = 1 << nd
        held: dict = avail[nd]
        plans: dict = src_cache[nd]
        cap: cython.double = capacity[nd]
        tile: cython.Py_ssize_t
        v: cython.longlong
        sz: cython.longlong
        key: cython.longlong
        u: cython.longlong
        src: cython.Py_ssize_t
        first: cython.Py_ssize_t
        last: cython.Py_ssize_t
        i: cython.Py_ssize_t
        t0: cython.double
        f: cython.double
        ready: cython.double
        lat: cython.double
        xfer: cython.double
        for j in range(read_ptr[task], read_ptr[task + 1]):
            tile = read_tile[j]
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
    def walk(by: cython.Py_ssize_t, w: cython.Py_ssize_t, key: cython.double) -> None:
        """Engine.walk with DequeModel._walked: the pushing worker pays for walking ``w``'s sorted queue."""
        k: list = keys[w]
        walked: cython.Py_ssize_t = 0 if not k or (k[0] == key and k[len(k) - 1] == key) else bisect_right(k, key)
        insort(k, key)
        h: cython.double
        now: cython.double
        if by >= 0 and walked:
            h = hold[by]
            now = env._now
            # list_walk_s (tilecast/simulator/queue_costs.py), inline
            if walk_far > 0.0 and walked > walk_knee:
                hold[by] = (now if now >= h else h) + (walk_knee * push_walk + (walked - walk_knee) * walk_far)
            else:
                hold[by] = (now if now >= h else h) + walked * push_walk

    def take(w: cython.Py_ssize_t, q) -> cython.Py_ssize_t:
        """The first task of ``w``'s queue, removed."""
        if not sorted_queues:
            return q.popleft()
        if walking:
            del keys[w][0]
        return heappop(q)[2]

    def begin(w: cython.Py_ssize_t, t: cython.Py_ssize_t) -> None:
        now: cython.double = env._now
        b: cython.double = now
        h: cython.double = hold[w]
        if h > b:
            b = h
        b = b + overhead
        if gap_before is not None:
            b = b + gap_before[t]
        if gap_handoff > 0.0 and made_by[t] >= 0 and made_by[t] != w:
            b = b + gap_handoff
        e: cython.double
        ready: cython.double
        r: cython.double
        nd: cython.Py_ssize_t
        tile: cython.Py_ssize_t
        d: cython.Py_ssize_t
        c: cython.longlong
        j: cython.Py_ssize_t
        v: cython.longlong
        low: cython.longlong
        bit: cython.longlong
        sz: cython.longlong
        held: dict
        if has_mem:  # Memory.acquire
            nd = wnode[w]
            cur[w] = t
            held = avail[nd]
            bit = 1 << nd
            ready = now
            for j in range(acc_ptr[t], acc_ptr[t + 1]):
                c = acc_code[j]
                tile = c >> 2
                got = held.pop(tile, None)
                if got is None:
                    r = bring(tile, nd, now, c & 1, t)
                else:
                    held[tile] = got  # most recently used
                    r = got
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
        dur: cython.double = rows[w][t] if wcache is None else wcache.duration(t, w)
        e = b + dur
        # dmda_pop_task + _starpu_fifo_task_transfer_started, dmda_pre_exec_hook + _starpu_fifo_task_started
        exp_len[w] = (exp_len[w] - predicted_transfer[t]) - predicted[t]
        exp_start[w] = b + predicted[t]
        busy[w] = True
        start[t] = b
        end[t] = e
        where[t] = w
        timeout(e - now, t).callbacks.append(finish)

    def push(task: cython.Py_ssize_t, by: cython.Py_ssize_t) -> None:
        now: cython.double = env._now
        d: cython.double
        e: cython.double
        x: cython.double
        best: cython.double
        p: cython.double
        length: cython.double
        arrival: cython.double
        w: cython.Py_ssize_t
        i: cython.Py_ssize_t
        tile: cython.Py_ssize_t
        v: cython.longlong
        has_pw: cython.bint = False
        j: cython.Py_ssize_t
        pw = None  # Memory.penalty, per worker: non-zero tile costs summed in read order
        if data_aware:
            for j in range(read_ptr[task], read_ptr[task + 1]):
                tile = read_tile[j]
                v = valid[tile]
                if v:
                    vec = pen_get(skey[tile] | v)
                    if vec is None:
                        vec = tile_penalty(v, size[tile])
                    if vec is not ZERO:
                        if cython.compiled:  # summed in place, in the same order
                            if has_pw:
                                for i in range(n_workers):
                                    pwc[i] = pwc[i] + vec[i]
                            else:
                                for i in range(n_workers):
                                    pwc[i] = vec[i]
                        else:
                            pw = vec if pw is None else list(map(add, pw, vec))
                        has_pw = True
        if cython.compiled:  # the policy's two scans: expected ends, then the first worker of least fitness
            best = inf
            d = row0[task] if one_kind else 0.0
            for i in range(n_workers):
                e = exp_start[i]
                x = (e if e > now else now) + exp_len[i]
                if has_pw:
                    arrival = now + pwc[i]
                    if arrival > x:
                        x = arrival
                x = x + (d if one_kind else erows[i][task])
                endc[i] = x
                if x < best:
                    best = x
            if not best < inf:
                raise RuntimeError(f"task {task}: no worker can run it")
            w = -1
            p = 0.0
            for i in range(n_workers):
                x = endc[i] - best
                if has_pw:
                    x = x + pwc[i]
                if w == -1 or x < p:
                    w, p = i, x
            if not endc[w] < inf:  # a NaN end first
                raise RuntimeError(f"task {task}: no worker can run it")
            d = erows[w][task]
            p = pwc[w] if has_pw else 0.0
        else:  # the same choice through list comprehensions, faster interpreted
            base = [(e if e > now else now) + l for e, l in zip(exp_start, exp_len)]
            if pw is not None:
                base = [(now + p if now + p > x else x) for x, p in zip(base, pw)]
            if one_kind:
                d = row0[task]
                f = [x + d for x in base]
            else:
                f = [x + r[task] for x, r in zip(base, erows)]
            best = min(f)
            if not best < inf:  # none finite, or a NaN first (min() would stop on it): the policy's scan
                best = inf
                for x in f:
                    if x < best:
                        best = x
                if not best < inf:
                    raise RuntimeError(f"task {task}: no worker can run it")
            if pw is None:
                fit = [x - best for x in f]
            else:
                fit = [(x - best) + p for x, p in zip(f, pw)]
            w = fit.index(min(fit))  # the first worker of least fitness, as the policy's scan
            if not f[w] < inf:  # a NaN end first
                raise RuntimeError(f"task {task}: no worker can run it")
            d = erows[w][task]
            p = pw[w] if pw is not None else 0.0
        # push_task_on_best_worker
        e = exp_start[w]
        if e < now:
            e = now
        exp_start[w] = e
        x = e + exp_len[w]
        arrival = now + p
        length = 0.0 if arrival < x else arrival - x
        exp_len[w] += length
        exp_len[w] += d
        predicted[task] = d
        predicted_transfer[task] = length
        q = queues[w]
        if q or busy[w] or w == pusher[0]:
            if has_mem and (q or busy[w]):  # an idle worker fetches at once anyway
                prefetch(task, wnode[w], now)
            if sorted_queues:
                pushed[0] += 1
                key = neg[task] if neg else 0.0
                heappush(q, (key, pushed[0], task))
                if walking:
                    walk(by, w, key)
            else:
                q.append(task)
            if not busy[w] and w != pusher[0]:  # the worker that just ended a task, its successors being pushed
                begin(w, take(w, q))
        else:
            begin(w, task)

    def finish(ev) -> None:
        t: cython.Py_ssize_t = ev._value
        w: cython.Py_ssize_t = where[t]
        s: cython.Py_ssize_t
        m: cython.Py_ssize_t
        j: cython.Py_ssize_t
        r: cython.double
        h: cython.double
        k: cython.Py_ssize_t
        busy[w] = False
        if exp_start[w] < env._now:  # dmda_post_exec_hook / _starpu_fifo_task_finished
            exp_start[w] = env._now
        if release is not None:  # Engine._released
            r = release[t]
            if gap_ready > 0.0:
                k = 0
                for j in range(succ_ptr[t], succ_ptr[t + 1]):
                    if missing[succ[j]] == 1:
                        k += 1
                r = r + k * gap_ready
            if r > 0.0:
                h = hold[w]
                hold[w] = (env._now if env._now >= h else h) + r
        if walking:
            pusher[0] = w
        for j in range(succ_ptr[t], succ_ptr[t + 1]):
            s = succ[j]
            m = missing[s] - 1
            missing[s] = m
            if not m:
                made_by[s] = w
                push(s, w)
        pusher[0] = -1
        if not busy[w]:
            q = queues[w]
            if q:
                begin(w, take(w, q))

    for t in [i for i, m in enumerate(missing) if m == 0]:
        push(t, -1)
    env.run()
    eng.n_done = eng.n_tasks - eng.where.count(-1)
    eng.idle = {w for w in range(n_workers) if not busy[w]}
    if has_mem:
        mem.running = [set() for _ in range(n_nodes)]

