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
4     sharded        ZeRO-3 (FSDP) per-layer parameter all-gathers, issued
                     ``fsdp_prefetch`` layers ahead, and per-layer gradient
                     reduce-scatters: one stream, as they share the NICs
====  =============  =====================================================

Dependencies are those a framework has: a forward waits for the previous
stage's send; a backward waits for the next stage's gradient send; gradient
buckets are reduced as the last micro-batch's backward produces them (or after
the flush when ``overlap_grad_reduce`` is off); the optimizer waits for its
stage's gradients; ZeRO-3 layers wait for their all-gather.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tilecast.cluster.pipeline_split import stage_layers
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
    tag: list = None  # what each task is: "F<micro-batch>.<chunk>", "B...", "send-F...", "grad", "optimizer", ...
    start: np.ndarray = None
    end: np.ndarray = None
    ep: np.ndarray = None  # seconds of blocking expert all-to-alls inside each compute task
    cp: np.ndarray = None  # seconds of exposed ring-attention communication inside each compute task

    @property
    def n_tasks(self) -> int:
        return len(self.duration)

    def simulate(self) -> "Timeline":
        self.start, self.end = simulate_streams(self.duration, self.stream, self.pred_ptr, self.pred, self.n_streams)
        return self


class _Builder:
    """Collects tasks in an order where every predecessor comes first (as the engine wants).

    Columns of numbers and predecessors as task ids: nothing per task that the garbage collector
    tracks (a 3072-GPU layout has thousands of tasks, built in milliseconds).
    """

    def __init__(self, n_micro_batches: int):
        self.dur, self.stream, self.kind, self.tp, self.tag = [], [], [], [], []
        self.ep, self.cp = [], []
        self.ptr, self.pred = [0], []
        self.m = n_micro_batches
        # the task of virtual stage vs and micro-batch j, at key vs * m + j: its forward's last compute
        # task, its forward's send to the next stage, its backward's send to the previous stage
        self.last_f, self.send_f, self.send_b = {}, {}, {}

    def add(self, stage, stream, kind, dur, preds=(), tp=0.0, tag="", ep=0.0, cp=0.0) -> int:
        """A task of ``stage`` on its ``stream`` (0-4) after the tasks ``preds``; returns its id."""
        i = len(self.dur)
        self.tag.append(tag)
        self.dur.append(dur)
        self.stream.append(stage * STREAMS_PER_STAGE + stream)
        self.kind.append(kind)
        self.tp.append(tp)
        self.ep.append(ep)
        self.cp.append(cp)
        self.pred.extend(preds)
        self.ptr.append(len(self.pred))
        return i

    def finish(self, n_stages) -> Timeline:
        stream = np.asarray(self.stream, dtype=np.int64)
        return Timeline(duration=np.asarray(self.dur, dtype=np.float64), stream=stream,
                        stage=stream // STREAMS_PER_STAGE, kind=np.asarray(self.kind, dtype=np.int8),
                        tp=np.asarray(self.tp, dtype=np.float64), pred_ptr=np.asarray(self.ptr, dtype=np.int64),
                        pred=np.asarray(self.pred, dtype=np.int64), n_streams=n_stages * STREAMS_PER_STAGE,
                        tag=self.tag, ep=np.asarray(self.ep, dtype=np.float64),
                        cp=np.asarray(self.cp, dtype=np.float64))


class _Stage:
    """Emits the tasks of one pipeline rank, one schedule entry at a time."""

    def __init__(self, s, b, shape, strat, c):
        p, v = strat.pp, strat.virtual_stages
        self.s, self.b, self.c, self.strat = s, b, c, strat
        self.p, self.v, self.n_virtual = p, v, p * v
        self.L = stage_layers(shape, strat)[s]
        self.order = stage_order(strat.schedule, p, strat.micro_batches, v, s)
        self.next = 0
        self.last_b = {ch: idx for idx, (ph, j, ch) in enumerate(self.order) if ph == "B"}
        # per schedule entry, the table and key of the neighbouring stage's send it waits for (None: none)
        m, last_vs = b.m, p * v - 1
        self.needs = [(None if ch * p + s == 0 else b.send_f, (ch * p + s - 1) * m + j) if ph == "F" else
                      (None if ch * p + s == last_vs else b.send_b, (ch * p + s + 1) * m + j)
                      for ph, j, ch in self.order]
        self.comp_hist, self.dp_tasks = [], []
        self.param_pieces = {}  # chunk -> all-gather task its first forward waits for (overlapped ZeRO-1/2)
        if strat.zero in (1, 2) and strat.overlap_param_gather:
            # the previous step's parameter all-gather, bucket by bucket in the order chunks run
            for ch in range(v):
                self.param_pieces[ch] = b.add(s, 3, DATA_PARALLEL, c.param_gather / v, [], tag="param-gather")
        self.n_buckets = max(1, min(self.L, math.ceil(c.grad_bytes / v / strat.bucket_bytes)))
        self.reduce_total = c.grad_reduce if strat.zero <= 1 else c.grad_scatter
        if strat.tp_comm_overlap:  # only the part of a collective longer than the GEMMs it hides behind shows
            self.fwd_tp = max(0.0, c.fwd_tp - c.fwd_compute)
            self.bwd_tp = max(0.0, c.bwd_tp - c.bwd_compute - c.recompute)
        else:
            self.fwd_tp, self.bwd_tp = c.fwd_tp, c.bwd_tp
        self.fwd_layer = c.fwd_compute + self.fwd_tp + c.fwd_ep + c.fwd_cp
        self.bwd_layer = c.bwd_compute + c.recompute + self.bwd_tp + c.bwd_ep + c.bwd_cp
        self.fwd_ep, self.bwd_ep, self.fwd_cp, self.bwd_cp = c.fwd_ep, c.bwd_ep, c.fwd_cp, c.bwd_cp
        if strat.zero in (1, 2):  # hybrid sharding: the sharded gradients all-reduced across the replicas too
            self.reduce_total += c.replica_reduce

    def compute(self, dur, preds, tp, tag, fw, layers=1.0):
        if fw:
            i = self.b.add(self.s, 0, COMPUTE, dur, preds, tp, tag, layers * self.fwd_ep, layers * self.fwd_cp)
        else:
            i = self.b.add(self.s, 0, COMPUTE, dur, preds, tp, tag, layers * self.bwd_ep, layers * self.bwd_cp)
        self.comp_hist.append(i)
        return i

    def gather(self):
        k = self.strat.fsdp_prefetch + 1
        pred = (self.comp_hist[-k],) if len(self.comp_hist) >= k else ()
        return self.b.add(self.s, 4, GATHER, self.c.layer_param_gather, pred, tag="gather")

    def emit(self):
        b, c, s, L, strat = self.b, self.c, self.s, self.L, self.strat
        idx = self.next
        ph, j, ch = self.order[idx]
        self.next += 1
        vs = ch * self.p + s
        key = vs * b.m + j
        is_last_vs = vs == self.n_virtual - 1
        zero = strat.zero
        if ph == "F":
            tag = f"F{j}.{ch}"
            head = c.head_fwd if is_last_vs else 0.0
            pre = [b.send_f[key - b.m]] if vs > 0 else []
            if j == 0 and ch in self.param_pieces:
                pre.append(self.param_pieces.pop(ch))
            if zero == 3:
                ag = self.gather()
                for layer in range(L):
                    last = self.compute(self.fwd_layer + (head if layer == L - 1 else 0.0),
                                        [ag] + (pre if layer == 0 else []), self.fwd_tp, tag, True)
                    if layer + 1 < L:
                        ag = self.gather()
            else:
                last = self.compute(L * self.fwd_layer + head, pre, L * self.fwd_tp, tag, True, L)
            b.last_f[key] = last
            if not is_last_vs:
                b.send_f[key] = b.add(s, 1, P2P, c.p2p, (last,), 0.0, "send-" + tag)
            return
        tag = f"B{j}.{ch}"
        head = c.head_bwd if is_last_vs else 0.0
        pre = [b.last_f[key]] + ([b.send_b[key + b.m]] if not is_last_vs else [])
        if zero == 3:
            # FSDP order on the one network stream: the next layer's all-gather is issued before
            # this layer's gradient reduce-scatter, so both share the NICs while the layer computes.
            ag = self.gather()
            for layer in range(L):
                last = self.compute(self.bwd_layer + (head if layer == 0 else 0.0),
                                    [ag] + (pre if layer == 0 else []), self.bwd_tp, tag, False)
                if layer + 1 < L:
                    ag = self.gather()
                self.dp_tasks.append(b.add(s, 4, DATA_PARALLEL, c.layer_grad_scatter, [last], tag="grad"))
        elif zero == 2 or (strat.overlap_grad_reduce and self.last_b[ch] == idx):
            n = self.n_buckets
            for k in range(n):
                last = self.compute(L * self.bwd_layer / n + (head if k == 0 else 0.0), pre if k == 0 else [],
                                    L * self.bwd_tp / n, tag, False, L / n)
                self.dp_tasks.append(b.add(s, 3, DATA_PARALLEL, self.reduce_total / self.v / n, [last], tag="grad"))
        else:
            last = self.compute(L * self.bwd_layer + head, pre, L * self.bwd_tp, tag, False, L)
        if vs > 0:
            b.send_b[key] = b.add(s, 2, P2P, c.p2p, (last,), 0.0, "send-" + tag)

    def close(self):
        """Gradient reduction after the flush (if not overlapped), optimizer, ZeRO-1/2 parameter gather."""
        b, c, s, strat = self.b, self.c, self.s, self.strat
        if strat.zero <= 1 and not strat.overlap_grad_reduce:
            self.dp_tasks.append(b.add(s, 3, DATA_PARALLEL, self.reduce_total, [self.comp_hist[-1]], tag="grad"))
        if strat.zero == 3 and c.replica_reduce:  # hybrid sharding: shards all-reduced across the replicas
            self.dp_tasks.append(b.add(s, 3, DATA_PARALLEL, c.replica_reduce, self.dp_tasks[-1:], tag="grad-replicas"))
        opt = b.add(s, 0, OPTIMIZER, c.optimizer, [self.comp_hist[-1]] + self.dp_tasks[-1:], tag="optimizer")
        if strat.zero in (1, 2) and not strat.overlap_param_gather:
            b.add(s, 3, DATA_PARALLEL, c.param_gather, [opt], tag="param-gather")


def build_timeline(shape, strat, c) -> Timeline:
    """Tasks of one pipeline for one step; ``c`` is a :class:`~tilecast.cluster.costs.LayerCosts`.

    Stages emit their schedule entries round-robin, each as soon as its inputs
    from the neighbouring stages exist, so every task comes after its
    predecessors and each stream keeps its schedule order.
    """
    b = _Builder(strat.micro_batches)
    stages = [_Stage(s, b, shape, strat, c) for s in range(strat.pp)]
    open_ = list(stages)
    while open_:
        progress = False
        for st in open_:
            n, needs = len(st.order), st.needs
            while st.next < n:
                table, key = needs[st.next]
                if table is not None and key not in table:
                    break  # the neighbouring stage's send is not emitted yet
                st.emit()
                progress = True
        done = [st for st in open_ if st.next == len(st.order)]
        for st in done:
            st.close()
        open_ = [st for st in open_ if st.next < len(st.order)]
        if not progress and open_:
            raise RuntimeError("timeline: the pipeline schedule deadlocks")
    return b.finish(strat.pp)


KIND_NAMES = {COMPUTE: "compute", OPTIMIZER: "optimizer", P2P: "p2p", DATA_PARALLEL: "dp-collective",
              GATHER: "zero3-gather"}


def to_trace(tl: Timeline):
    """The simulated timeline in tilecast's trace schema: node = pipeline stage,
    worker = stream of that stage, tag = what the task is (e.g. ``F3.0``: forward of
    micro-batch 3, chunk 0)."""
    from tilecast.trace import make_trace

    kernel = np.array([KIND_NAMES[int(k)] for k in tl.kind], dtype=object)
    return make_trace(task=np.arange(tl.n_tasks), kernel=kernel, worker=tl.stream % STREAMS_PER_STAGE,
                      node=tl.stage, start_s=tl.start, end_s=tl.end, bytes=0, flops=0.0, source="sim",
                      tag=np.asarray(tl.tag, dtype=object))


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
    ep_total = float(tl.ep[sel][kind == COMPUTE].sum()) if tl.ep is not None else 0.0
    cp_total = float(tl.cp[sel][kind == COMPUTE].sum()) if tl.cp is not None else 0.0
    blocking = tp_total + ep_total + cp_total
    exposed = blocking + (busy - busy_c)
    return {
        "step_s": step,
        "compute_s": busy_c - optimizer - blocking,
        "exposed_comm_s": exposed,
        "overlapped_comm_s": overlapped,
        "bubble_s": step - busy,
        "optimizer_s": optimizer,
        "tp_comm_s": tp_total,
        "ep_comm_s": ep_total,
        "cp_comm_s": cp_total,
        "stage": s,
    }
