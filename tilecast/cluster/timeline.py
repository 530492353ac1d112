"""The layer-level task graph of one pipeline, simulated by the stream engine.

By symmetry one pipeline (``pp`` ranks, one per stage) stands for all tensor-
and data-parallel replicas: every rank of a stage does the same work at the
same time, so the collectives among them are costed, not simulated rank by rank.

Each stage has five in-order streams, as a framework's CUDA streams:

====  =============  =====================================================
id    stream         tasks
====  =============  =====================================================
0     compute        forward/backward of a chunk of layers (with their
                     blocking tensor-parallel collectives), optimizer step
1     send-forward   activations to the next stage
2     send-backward  activation gradients to the previous stage
3     data-parallel  gradient all-reduce / reduce-scatter buckets, ZeRO
                     parameter all-gather after the optimizer
4     gather         ZeRO-3 (FSDP) per-layer parameter all-gathers, issued
                     ``fsdp_prefetch`` layers ahead
====  =============  =====================================================

Dependencies are those a framework has: a forward waits for the previous
stage's send; a backward waits for the next stage's gradient send; gradient
buckets are reduced as the last micro-batch's backward produces them (or after
the flush when ``overlap_grad_reduce`` is off); the optimizer waits for its
stage's gradients; ZeRO-3 layers wait for their all-gather.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from tilecast.cluster.schedule import stage_order
from tilecast.simulator.streams import simulate_streams

STREAMS_PER_STAGE = 5
COMPUTE, OPTIMIZER, P2P, DATA_PARALLEL, GATHER = 0, 1, 2, 3, 4


@dataclass
class Timeline:
    duration: np.ndarray
    stream: np.ndarray
    stage: np.ndarray
    kind: np.ndarray
    tp: np.ndarray  # seconds of blocking tensor-parallel communication inside each compute task
    pred_ptr: np.ndarray
    pred: np.ndarray
    n_streams: int
    start: np.ndarray = None
    end: np.ndarray = None

    @property
    def n_tasks(self) -> int:
        return len(self.duration)

    def simulate(self) -> "Timeline":
        self.start, self.end = simulate_streams(self.duration, self.stream, self.pred_ptr, self.pred, self.n_streams)
        return self


class _Builder:
    def __init__(self):
        self.dur, self.stream, self.stage, self.kind, self.tp, self.preds = [], [], [], [], [], []
        self.names = {}

    def add(self, stage, stream, kind, dur, preds=(), tp=0.0) -> int:
        i = len(self.dur)
        self.dur.append(float(dur))
        self.stream.append(stage * STREAMS_PER_STAGE + stream)
        self.stage.append(stage)
        self.kind.append(kind)
        self.tp.append(float(tp))
        self.preds.append([q for q in preds if q is not None])
        return i

    def finish(self, n_stages) -> Timeline:
        n = len(self.dur)
        resolved = [[q if isinstance(q, int) else self.names[q] for q in ps] for ps in self.preds]
        # Stable topological order (by creation index) that keeps each stream's order:
        # the engine wants predecessors before their tasks.
        succ = [[] for _ in range(n)]
        indeg = np.zeros(n, dtype=np.int64)
        last_on = {}
        for i in range(n):
            deps = set(resolved[i])
            prev = last_on.get(self.stream[i])
            if prev is not None:
                deps.add(prev)
            last_on[self.stream[i]] = i
            resolved[i] = deps
            for q in deps:
                succ[q].append(i)
            indeg[i] = len(deps)
        ready = [i for i in range(n) if indeg[i] == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            i = heapq.heappop(ready)
            order.append(i)
            for j in succ[i]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    heapq.heappush(ready, j)
        if len(order) != n:
            raise RuntimeError("timeline: the schedule has a dependency cycle")
        order = np.asarray(order, dtype=np.int64)
        new = np.empty(n, dtype=np.int64)
        new[order] = np.arange(n)
        counts = np.array([len(resolved[i]) for i in order], dtype=np.int64)
        ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=ptr[1:])
        pred = np.fromiter((new[q] for i in order for q in sorted(resolved[i])), dtype=np.int64, count=int(ptr[-1]))
        arr = lambda a, dt: np.asarray(a, dtype=dt)[order]  # noqa: E731
        return Timeline(duration=arr(self.dur, np.float64), stream=arr(self.stream, np.int64),
                        stage=arr(self.stage, np.int64), kind=arr(self.kind, np.int8), tp=arr(self.tp, np.float64),
                        pred_ptr=ptr, pred=pred, n_streams=n_stages * STREAMS_PER_STAGE)


def build_timeline(shape, strat, c) -> Timeline:
    """Tasks of one pipeline for one step; ``c`` is a :class:`~tilecast.cluster.costs.LayerCosts`."""
    p, m, v = strat.pp, strat.micro_batches, strat.virtual_stages
    n_virtual = p * v
    L = shape.n_layer // n_virtual
    zero, overlap = strat.zero, strat.overlap_grad_reduce
    chunk_grad = c.grad_bytes / v
    n_buckets = max(1, min(L, math.ceil(chunk_grad / strat.bucket_bytes)))
    reduce_total = c.grad_reduce if zero <= 1 else c.grad_scatter
    b = _Builder()
    fwd_layer = c.fwd_compute + c.fwd_tp
    bwd_layer = c.bwd_compute + c.recompute + c.bwd_tp

    for s in range(p):
        order = stage_order(strat.schedule, p, m, v, s)
        last_b = {}
        for idx, (ph, j, ch) in enumerate(order):
            if ph == "B":
                last_b[ch] = idx
        comp_hist = []
        dp_tasks = []

        def compute(dur, preds, tp=0.0):
            i = b.add(s, 0, COMPUTE, dur, preds, tp)
            comp_hist.append(i)
            return i

        def gather_pred():
            k = strat.fsdp_prefetch + 1
            return comp_hist[-k] if len(comp_hist) >= k else None

        for idx, (ph, j, ch) in enumerate(order):
            vs = ch * p + s
            is_last_vs = vs == n_virtual - 1
            head_f = c.head_fwd if is_last_vs else 0.0
            head_b = c.head_bwd if is_last_vs else 0.0
            if ph == "F":
                pre = [("sendF", vs - 1, j)] if vs > 0 else []
                if zero == 3:
                    last = None
                    for layer in range(L):
                        ag = b.add(s, 4, GATHER, c.layer_param_gather, [gather_pred()])
                        extra = head_f if layer == L - 1 else 0.0
                        last = compute(fwd_layer + extra, [ag] + (pre if layer == 0 else []), c.fwd_tp)
                else:
                    last = compute(L * fwd_layer + head_f, pre, L * c.fwd_tp)
                b.names[("lastF", vs, j)] = last
                if not is_last_vs:
                    b.names[("sendF", vs, j)] = b.add(s, 1, P2P, c.p2p, [last])
            else:
                pre = [("lastF", vs, j)] + ([("sendB", vs + 1, j)] if not is_last_vs else [])
                if zero == 3:
                    last = None
                    for layer in range(L):
                        ag = b.add(s, 4, GATHER, c.layer_param_gather, [gather_pred()])
                        extra = head_b if layer == 0 else 0.0
                        last = compute(bwd_layer + extra, [ag] + (pre if layer == 0 else []), c.bwd_tp)
                        dp_tasks.append(b.add(s, 3, DATA_PARALLEL, c.layer_grad_scatter, [last]))
                elif zero == 2 or (overlap and last_b[ch] == idx):
                    last = None
                    for k in range(n_buckets):
                        extra = head_b if k == 0 else 0.0
                        last = compute(L * bwd_layer / n_buckets + extra, pre if k == 0 else [],
                                       L * c.bwd_tp / n_buckets)
                        dp_tasks.append(b.add(s, 3, DATA_PARALLEL, reduce_total / v / n_buckets, [last]))
                else:
                    last = compute(L * bwd_layer + head_b, pre, L * c.bwd_tp)
                if vs > 0:
                    b.names[("sendB", vs, j)] = b.add(s, 2, P2P, c.p2p, [last])
        if zero <= 1 and not overlap:
            dp_tasks.append(b.add(s, 3, DATA_PARALLEL, reduce_total, [comp_hist[-1]]))
        opt = b.add(s, 0, OPTIMIZER, c.optimizer, [comp_hist[-1]] + dp_tasks[-1:])
        if zero in (1, 2):
            b.add(s, 3, DATA_PARALLEL, c.param_gather, [opt])
    return b.finish(p)


def _union(start, end) -> float:
    """Length of the union of intervals."""
    if len(start) == 0:
        return 0.0
    o = np.argsort(start, kind="stable")
    s, e = start[o], end[o]
    run_end = np.maximum.accumulate(e)
    gap = np.maximum(s[1:] - run_end[:-1], 0.0)
    return float(run_end[-1] - s[0] - gap.sum())


def breakdown(tl: Timeline) -> dict:
    """Step time of the slowest stage split into compute, exposed and overlapped
    communication, pipeline bubble and optimizer (seconds).

    compute + exposed_comm + bubble + optimizer = step. Tensor-parallel
    collectives block the compute stream, so they count as exposed. Overlapped
    communication ran while the compute stream was busy; the bubble is the time
    the stage had nothing running at all.
    """
    step = float(tl.end.max()) if tl.n_tasks else 0.0
    stage_end = np.zeros(int(tl.stage.max()) + 1)
    np.maximum.at(stage_end, tl.stage, tl.end)
    s = int(np.argmax(stage_end))
    sel = tl.stage == s
    st, en, kind, tp = tl.start[sel], tl.end[sel], tl.kind[sel], tl.tp[sel]
    on_compute = (kind == COMPUTE) | (kind == OPTIMIZER)
    comm = ~on_compute
    busy_c = _union(st[on_compute], en[on_compute])
    busy_m = _union(st[comm], en[comm])
    busy = _union(st, en)
    overlapped = busy_c + busy_m - busy
    optimizer = float((en - st)[kind == OPTIMIZER].sum())
    tp_total = float(tp[kind == COMPUTE].sum())
    exposed = tp_total + (busy - busy_c)
    return {
        "step_s": step,
        "compute_s": busy_c - optimizer - tp_total,
        "exposed_comm_s": exposed,
        "overlapped_comm_s": overlapped,
        "bubble_s": step - busy,
        "optimizer_s": optimizer,
        "tp_comm_s": tp_total,
        "stage": s,
    }
