"""Repeated training steps on StarPU, timed: what ``tilecast run`` measures.

The step's state stays in its tiles between steps, as in a training loop:
parameters and AdamW moments are updated in place by the graph's AdamW tasks,
gradients are overwritten by their first contribution each step, and only the
batch (ids, targets) and AdamW's step number change. Data are random tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from tilecast.executor.starpu_session import StarPUSession
from tilecast.reference.step import (TrainState, init_params, load_initial, load_step, reference_step, set_batch,
                                    step_loss)
from tilecast.reference.verify import TOLERANCES, rel_err
from tilecast.graph.gpt2 import AdamWConfig, grad_name
from tilecast.graph.models import build_step
from tilecast.kernels import get
from tilecast.trace import with_disk_counters
from tilecast.errors import FieldError


@dataclass
class RunResult:
    """Per-step wall times, makespans (submission to the last task's end) and losses, the graph's
    figures, the last step's trace, the check."""

    step_s: list[float]
    losses: list[float]
    tokens_per_step: int
    flops_per_step: float
    n_tasks: int
    trace: object = None
    graph: object = None
    check: dict | None = None
    workers: list[str] = field(default_factory=list)
    makespan_s: list[float] = field(default_factory=list)
    traces: list = field(default_factory=list)  # the traced steps' traces (the last one is ``trace``)
    disk_written: list[int] = field(default_factory=list)  # bytes StarPU wrote to its disk node, per step
    disk_read: list[int] = field(default_factory=list)  # bytes it read back, per step
    disk_writes: list[int] = field(default_factory=list)  # transfers to the disk node (tiles), per step
    disk_reads: list[int] = field(default_factory=list)  # transfers back from it (tiles), per step
    peak_rss_bytes: int = 0  # the process's peak resident set size at the end of the run

    @property
    def median_step_s(self) -> float:
        """Median step time, leaving out the first step (warm-up, performance-model calibration)."""
        steps = self.step_s[1:] or self.step_s
        return float(np.median(steps))

    @property
    def host_s(self) -> float:
        """Median time a step spends outside its task graph (step less makespan), steps after the first."""
        steps, spans = self.step_s[1:] or self.step_s, self.makespan_s[1:] or self.makespan_s
        return float(np.median(np.subtract(steps, spans))) if spans else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.median_step_s

    @property
    def gflops(self) -> float:
        return self.flops_per_step / self.median_step_s / 1e9


def adamw_expected(graph, initial: dict, grads: dict) -> dict:
    """Parameters after the graph's first AdamW step (zero moments) applied to ``grads``, with numpy."""
    k = get("adamw")
    _, table = graph.kernel_params(k.id)
    out = {}
    for name, w0 in initial.items():
        w = w0.astype(np.float32).ravel().copy()
        g = np.ascontiguousarray(grads[name], dtype=np.float32).ravel()
        m, v = np.zeros_like(w), np.zeros_like(w)
        p = dict(zip(k.params, table[0]), n=w.size, step=1.0)
        k.reference(np, [w, g, m, v], k.unpack([p[n] for n in k.params]))
        out[name] = w.reshape(w0.shape)
    return out


def check_step(got_loss: float, got_grads: dict, got_params: dict, want, expected_params: dict) -> dict:
    """Errors of a first step against the reference execution (loss 1e-5, gradients and parameters 1e-4).

    Gradients that are rounding noise in the reference (zero in exact arithmetic,
    e.g. the attention key bias) cannot match to a relative tolerance; only the
    size of their noise is checked. Parameters are checked against AdamW applied
    with numpy to the step's own gradients (``expected_params``): comparing them
    with the reference's parameters instead would be ill-conditioned in float32,
    since AdamW moves an element whose gradient is near eps by lr * g / (|g| + eps),
    turning last-bit gradient differences into large parameter differences (that
    figure is reported as ``params_vs_reference``, for information).
    """
    ref_loss, ref_grads, ref_params = want
    scale = max(float(np.abs(g).max()) for g in ref_grads.values())
    noise = {n for n, g in ref_grads.items() if float(np.abs(g).max()) < 1e-5 * scale}
    grads = {n: rel_err(got_grads[n], g) for n, g in ref_grads.items() if n not in noise}
    params = {n: rel_err(got_params[n], p) for n, p in expected_params.items()}
    failures = [f"grad {n}" for n, e in grads.items() if not e <= TOLERANCES["grads"]]
    failures += [f"param {n}" for n, e in params.items() if not e <= TOLERANCES["params"]]
    failures += [f"noise grad {n}" for n in noise if not float(np.abs(got_grads[n]).max()) < 1e-5 * scale]
    loss = abs(got_loss - ref_loss) / abs(ref_loss)
    if not loss <= TOLERANCES["loss"]:
        failures.insert(0, "loss")
    vs_ref = max((rel_err(got_params[n], p) for n, p in ref_params.items() if n not in noise), default=0.0)
    return {"ok": not failures, "loss": loss, "grads": max(grads.values(), default=0.0),
            "params": max(params.values(), default=0.0), "params_vs_reference": vs_ref,
            "noise_grads": sorted(noise), "failures": failures}


class StarPUTraining:
    """Training steps of ``graph`` on an open session, the state kept in one TileStore.

    ``data`` is an int array (steps, batch, seq + 1) of tokens; step ``t`` reads ``data[t]``.
    """

    def __init__(self, session, graph, state: TrainState | tuple, data: np.ndarray):
        """``state``: a TrainState, or (cfg, seed) for the initial state streamed into StarPU-managed tiles
        one parameter at a time (:func:`~tilecast.reference.step.load_initial`; under a memory limit)."""
        self.session, self.graph, self.data = session, graph, data
        store = session_store(session, graph)
        if isinstance(state, tuple):
            self.store = load_initial(graph, *state, data[0, :, :-1], data[0, :, 1:], store=store)
        else:
            self.store = load_step(graph, state, data[0, :, :-1], data[0, :, 1:], store=store)
        self.t = 0
        self.marks = {}  # the last step's timeline (see step)

    def step(self, trace: bool = True):
        """Run the next step; returns (seconds, loss, trace or None). ``marks`` then holds the step's
        timeline (perf_counter seconds: the session's marks, the step's start, the batch loaded, the loss read)."""
        t = self.t
        t0 = time.perf_counter()
        if t:
            set_batch(self.graph, self.store, self.data[t, :, :-1], self.data[t, :, 1:], t + 1)
        batch = time.perf_counter()
        trace = self.session.execute(self.graph, self.store, trace=trace)
        seconds = self.session.tasks_done_at - t0  # building the trace is not part of the step
        self.t += 1
        loss = step_loss(self.store)
        self.marks = dict(self.session.last_marks, step_start=t0, batch_loaded=batch,
                          loss_read=time.perf_counter())
        return seconds, loss, trace


def session_store(session, graph):
    """The store a session's steps use: StarPU-managed tiles under a memory limit (StarPU may evict
    them), else None (load_step makes in-place numpy tiles)."""
    if session.memory is None:
        return None
    from tilecast.executor.managed_tiles import ManagedTileStore

    return ManagedTileStore(graph, session)


def peak_rss_bytes() -> int:
    """The process's peak resident set size: ``VmHWM`` of /proc/self/status, the peak of this address space.
    Not ``ru_maxrss``: Linux carries it over from the parent through fork and exec, so a process started by a
    large one (a test runner, a notebook kernel) reports the parent's size at the fork as its own peak.
    ``ru_maxrss`` only where /proc has no ``VmHWM``."""
    from tilecast.executor.memory_limit import proc_status_bytes

    peak = proc_status_bytes("VmHWM")
    if peak is not None:
        return peak
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_steps(cfg, batch: int, seq: int, tiling, sched: str, workers: int | None, steps: int, seed: int = 0,
              lr: float = 1e-3, check: bool = False, progress=None, trace_from: int | None = None,
              recompute: str = "none", memory=None) -> RunResult:
    """Run ``steps`` training steps of ``cfg`` on StarPU; time each (the whole graph, submission to last task).

    ``recompute``: the step's activation recompute setting (:mod:`tilecast.graph.recompute`); the
    check compares with the numpy reference execution of the same graph.

    The last step is traced (``trace``); with ``trace_from``, every step from that one on is, and
    ``traces`` holds them all (building a trace is not part of a step's time).
    ``memory`` (a :class:`~tilecast.executor.memory_limit.MemoryLimit`) limits StarPU's main memory
    and gives it a disk node; tiles are then StarPU-managed, and a limit below the step's smallest
    working set raises :class:`~tilecast.executor.memory_limit.MemoryLimitError` before StarPU starts.
    """
    if steps < 1:
        raise FieldError(f"steps must be at least 1, got {steps}")
    session = StarPUSession(sched, workers, memory=memory)  # validates before the graph is built
    graph = build_step(cfg, batch, seq, tiling, AdamWConfig(lr=lr), recompute=recompute)
    if memory is not None:
        memory.check([graph], session.n_cpus)
    # Under a memory limit the parameters go straight into StarPU's tiles, one at a time (no numpy copy
    # of the whole model), unless the reference check needs them.
    state = (cfg, seed) if memory is not None and not check else TrainState(init_params(cfg, seed))
    data = np.random.default_rng(seed).integers(0, cfg.vocab_size, size=(steps, batch, seq + 1))
    ref_state = TrainState({k: v.copy() for k, v in state.params.items()}) if check else None
    start_params = {k: v.copy() for k, v in state.params.items()} if check else None
    step_s, makespans, losses, trace, report, traces = [], [], [], None, None, []
    written, read, writes, reads = [], [], [], []
    first_traced = steps - 1 if trace_from is None else min(max(trace_from, 0), steps - 1)
    with session:
        training = StarPUTraining(session, graph, state, data)
        session.disk_traffic()  # loading the state is not part of a step
        for t in range(steps):
            dt, loss, trace = training.step(trace=(t >= first_traced))
            disk = session.disk_transfers()
            if trace is not None:
                if session.disk_node >= 0:  # the step's disk traffic, kept with its trace
                    trace = with_disk_counters(trace, **disk)
                traces.append(trace)
            step_s.append(dt)
            makespans.append(session.last_makespan_s)
            losses.append(loss)
            written.append(disk["written_bytes"])
            read.append(disk["read_bytes"])
            writes.append(disk["writes"])
            reads.append(disk["reads"])
            if check and t == 0:
                store = training.store
                got = (loss, {n: store.tensor(grad_name(n)) for n in state.params},
                       {n: store.tensor(n) for n in state.params})
            if progress:
                progress(t, dt, loss)
        names = list(session.worker_names)
    if check:
        ref = reference_step(graph, ref_state, data[0, :, :-1], data[0, :, 1:])  # sets AdamW step 1 again
        report = check_step(*got, (ref.loss, ref.grads, ref_state.params), adamw_expected(graph, start_params, got[1]))
    return RunResult(step_s=step_s, losses=losses, tokens_per_step=batch * seq,
                     flops_per_step=float(graph.flops.sum()), n_tasks=graph.n_tasks, trace=trace, graph=graph,
                     check=report, workers=names, makespan_s=makespans, traces=traces,
                     disk_written=written, disk_read=read, disk_writes=writes, disk_reads=reads,
                     peak_rss_bytes=peak_rss_bytes())
