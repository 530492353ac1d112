"""tilecast as a Python library: one call per command, each returning a result with ``.to_frame()``.

>>> import tilecast as tc
>>> sim = tc.simulate("gpt2-tiny", batch=2, seq=32, tile=32, machine="h100-sxm5-80gb-8")   # doctest: +SKIP
>>> sim.step_s, sim.to_frame()                                                              # doctest: +SKIP

Every entry point calls the library functions its command calls (``tilecast
simulate`` and :func:`simulate` both predict through
:func:`tilecast.loop.predict.predict`), so a figure here equals the command's
``--json`` figure for the same configuration. Results are dataclasses with
typed fields, a pandas ``to_frame()``, ``to_dict()`` (JSON-ready) and an HTML
view in notebooks. Bad input raises ``ValueError`` (:class:`tilecast.errors.FieldError` or a package's
own) whose message starts with the argument at fault; the commands map it to their flag. The calls live
in this package's modules by concept: ``base`` (what results share, ``model``), ``cluster_calls``
(``whatif*``, ``load_cluster``), ``validation``, ``policies`` (``simulate_policies``), ``tuning``, ``training``, ``checks``
(``verify``, ``accuracy``, ``demo``), ``calibration`` (``calibrate``, ``calibrate_network``, ``check_speed``), ``ranks``
(``run_ranks``, ``train_ranks``, ``simulate_ranks``, ``tune_ranks``), ``sweeps`` (``whatif_sweep``),
``serving_search`` (``whatif_inference_search``), ``schedules`` (``gantt``, ``kernel_times``),
``recalibration`` (``recalibrate``), ``memory_sizes`` (``memory``);
``graph``, ``simulate``, ``run`` and ``compare`` are here.
See docs/api.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tilecast.errors import FieldError

__all__ = ["model", "graph", "simulate", "tune", "run", "compare", "whatif", "validate",
           "ModelResult", "GraphResult", "SimulateResult", "TuneResult", "RunResult", "CompareResult",
           "WhatifResult", "ValidateResult", "whatif_inference", "InferenceWhatifResult",
           "validate_inference", "InferenceValidateResult", "whatif_search", "WhatifSearchResult",
           "simulate_policies", "PoliciesResult", "verify", "VerifyResult", "accuracy", "AccuracyResult",
           "demo", "DemoResult", "train", "TrainResult", "calibrate", "CalibrateResult", "calibrate_network",
           "NetworkResult", "check_speed", "SpeedCheckResult", "whatif_sweep", "WhatifSweepResult",
           "whatif_inference_search", "InferenceSearchResult", "load_cluster",
           "run_ranks", "RanksRunResult", "train_ranks",
           "RanksTrainResult", "simulate_ranks", "RanksSimulateResult", "tune_ranks", "RanksTuneResult",
           "gantt", "kernel_times", "recalibrate", "RecalibrateResult", "memory", "MemoryResult"]


from tilecast.api.base import ModelResult, _config, _positive, _Result, _shape, _tiling, model  # noqa: F401
from tilecast.api.calibration import (CalibrateResult, NetworkResult, SpeedCheckResult, calibrate,  # noqa: F401
                                      calibrate_network, check_speed)
from tilecast.api.checks import AccuracyResult, DemoResult, VerifyResult, accuracy, demo, verify  # noqa: F401
from tilecast.api.cluster_calls import (InferenceWhatifResult, WhatifResult, WhatifSearchResult,  # noqa: F401
                                        load_cluster, whatif, whatif_inference, whatif_search)
from tilecast.api.memory_sizes import MemoryResult, memory  # noqa: F401
from tilecast.api.policies import PoliciesResult, simulate_policies  # noqa: F401
from tilecast.api.ranks import (RanksRunResult, RanksSimulateResult, RanksTrainResult,  # noqa: F401
                                RanksTuneResult, run_ranks, simulate_ranks, train_ranks, tune_ranks)
from tilecast.api.recalibration import RecalibrateResult, recalibrate  # noqa: F401
from tilecast.api.schedules import gantt, kernel_times  # noqa: F401
from tilecast.api.serving_search import InferenceSearchResult, whatif_inference_search  # noqa: F401
from tilecast.api.sweeps import WhatifSweepResult, whatif_sweep  # noqa: F401
from tilecast.api.training import TrainResult, train  # noqa: F401
from tilecast.api.tuning import TuneResult, tune  # noqa: F401
from tilecast.api.validation import (InferenceValidateResult, ValidateResult, validate,  # noqa: F401
                                     validate_inference)


# --- graph -------------------------------------------------------------------------------------------------
# The recompute settings are compared by default up to this many tasks: beyond, building the step twice more
# would double a call that must stay interactive on steps of millions of tasks.
COMPARE_MAX_TASKS = 500_000


@dataclass
class GraphResult(_Result):
    """One training step's task graph, summarised as ``tilecast graph`` summarises it; ``to_frame()`` is the
    table per kernel, ``graph`` the :class:`tilecast.graph.graph.Graph` itself, ``summary`` every figure of
    ``tilecast graph --json`` (keys and units in docs/cli.md); ``recompute_settings``: tasks, flops and live
    memory of the same step under each recompute setting compared; ``ranks``: the per-rank figures when the
    step was spread over ranks (docs/mpi.md)."""

    model: str
    batch: int
    seq: int
    tiling: str
    tasks: int
    tiles: int
    flops: float
    bytes: int
    live_bytes: int
    critical_path_flops: float
    kernels: dict
    graph: object = field(repr=False, default=None)
    recompute: str = "none"
    recompute_settings: dict = field(default_factory=dict)
    ranks: dict | None = field(repr=False, default=None)
    summary: dict = field(repr=False, default_factory=dict)

    def to_frame(self):
        from tilecast.graph.analysis import kernel_table

        return kernel_table(self.graph)

    def recompute_frame(self):
        """One row per recompute setting compared: tasks, flops, live_bytes, live_activation_bytes."""
        import pandas as pd

        return pd.DataFrame([{"recompute": k, **v} for k, v in self.recompute_settings.items()])

    def _headline(self) -> str:
        return (f"{self.model}, batch {self.batch} x {self.seq}, tiling {self.tiling}: {self.tasks} tasks, "
                f"{self.tiles} tiles, {self.flops:.4g} flops")


def recompute_figures(graph) -> dict:
    """What the comparison of recompute settings shows for one step's graph."""
    from tilecast.graph.analysis import live_memory

    live = live_memory(graph)
    return {"tasks": int(graph.n_tasks), "flops": float(graph.flops.sum()), "live_bytes": live["peak_bytes"],
            "live_activation_bytes": live["activation_peak_bytes"]}


def graph(model="gpt2", batch: int = 4, seq: int = 256, tile="256", recompute: str = "none",
          compare_recompute: bool | None = False, ranks: int | None = None, distribution: str = "data",
          progress=None, compare_max_tasks: int = COMPARE_MAX_TASKS) -> GraphResult:
    """Build the task graph of one training step (``tilecast graph``); ``recompute``: none, selective or full
    (:mod:`tilecast.graph.recompute`). ``compare_recompute``: also build the step under every recompute
    setting (None: only for steps of at most ``compare_max_tasks`` tasks); ``ranks``, ``distribution``: spread
    the step over that many StarPU-MPI ranks and add the per-rank figures; ``progress``: called with (tasks
    swept since its last call, tasks in all) as the critical path is swept."""
    from tilecast.graph.analysis import summary
    from tilecast.graph.models import build_step
    from tilecast.graph.recompute import RECOMPUTE, check_recompute
    from tilecast.graph.size_estimate import check_step_size
    from tilecast.simulator.native import longest_path_end  # compiled; None where it cannot be built

    cfg, tiling = _config(model), _tiling(tile)
    _shape(cfg, batch, seq)
    recompute = check_recompute(recompute)
    if ranks is not None:
        _positive("ranks", ranks)
    check_step_size(cfg, batch, seq, tiling, recompute, "graph")  # a step too large: refused before building
    g = build_step(cfg, batch, seq, tiling, recompute=recompute)
    rank_figs = None
    if ranks is not None:
        from tilecast.graph.distribution import prepare
        from tilecast.graph.owner_computes import rank_figures

        rank_figs = rank_figures(*prepare(g, ranks, distribution))
    s = summary(g, progress=None if progress is None else lambda n: progress(n, g.n_tasks),
                sweep=longest_path_end)
    s["recompute"] = recompute
    s["recompute_settings"] = {}
    if compare_recompute is None:
        compare_recompute = g.n_tasks <= compare_max_tasks
    for setting in RECOMPUTE if compare_recompute else [recompute]:
        other = g if setting == recompute else build_step(cfg, batch, seq, tiling, recompute=setting)
        s["recompute_settings"][setting] = recompute_figures(other)
        del other
    if rank_figs is not None:
        s["ranks"] = rank_figs
    return GraphResult(cfg.name, batch, seq, tiling.describe(), s["tasks"], s["tiles"], s["flops"], s["bytes"],
                       s["live_bytes"], s["critical_path_flops"], s["kernels"], g, recompute,
                       s["recompute_settings"], rank_figs, s)


# --- simulate ----------------------------------------------------------------------------------------------
@dataclass
class SimulateResult(_Result):
    """A predicted step (``tilecast simulate``): the step time, its parts and the simulation's summary;
    ``trace()`` is the predicted trace, ``prediction`` the :class:`tilecast.loop.predict.Prediction`."""

    model: str
    batch: int
    seq: int
    tiling: str
    machine: str
    sched: str
    workers: int
    step_s: float
    makespan_s: float
    host_s: float
    host_known: bool
    host_cost: str
    tasks: int
    tiles: int
    utilization: float
    critical_path_s: float
    work_bound_s: float
    tokens_per_s: float
    task_overhead_us: float
    calibration: str
    summary: dict = field(repr=False, default_factory=dict)
    prediction: object = field(repr=False, default=None)
    graph: object = field(repr=False, default=None)
    # tasks whose duration was measured, fitted (interpolated + extrapolated), roofline
    duration_sources: dict = field(default_factory=dict)
    simulation_s: float = 0.0  # seconds the simulation took (not the graph's build)

    def trace(self):
        """The predicted trace (the :mod:`tilecast.trace` schema), recording the predicted step time."""
        from tilecast.trace import with_step_time

        return with_step_time(self.prediction.result.trace(), self.step_s)

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([{k: v for k, v in self.to_dict().items() if not isinstance(v, (dict, list))}])

    def _headline(self) -> str:
        return (f"{self.model} {self.batch}x{self.seq} tile {self.tiling} on {self.machine}, {self.sched}, "
                f"{self.workers} workers: predicted step {self.step_s * 1e3:.3f} ms")


def simulate(model="gpt2", batch: int = 4, seq: int = 256, tile="256", machine="local", sched: str = "dmda",
             workers: int | None = None, calibration: str | None = None, transfers: bool = True,
             sched_seed: int = 0, recompute: str = "none", memory_limit: str | int | None = None,
             offload_dir: str | None = None, offload_io: str = "buffered") -> SimulateResult:
    """Predict one step on a machine under a StarPU policy (``tilecast simulate``): the simulated makespan plus
    the executor's host cost where it was measured. ``machine``: ``local``, a shipped name or a YAML file (or a
    :class:`tilecast.perfmodel.machine.Machine`); ``calibration``: a kernel calibration file (default: the one
    stored for the machine); ``sched_seed``: the random policy's seed. ``memory_limit`` (bytes or a size such as ``"512MiB"``) with ``offload_dir``:
    the step under StarPU's main-memory limit with a disk node there (evictions and disk bytes in ``summary``,
    docs/memory.md); a limit below the step's smallest working set raises an error with the minimum;
    ``offload_io``: ``"buffered"`` (through the page cache) or ``"direct"`` (O_DIRECT, forecast at the device's
    figures)."""
    import time

    from tilecast.loop.config import StepConfig
    from tilecast.loop.predict import host_note, predict
    from tilecast.simulator.simulate import POLICIES

    cfg, tiling = _config(model), _tiling(tile)
    _shape(cfg, batch, seq)
    if sched not in POLICIES:
        raise FieldError(f"sched must be one of {', '.join(POLICIES)}, got {sched!r}")
    st = _prepared_step(cfg, batch, seq, tiling, machine, workers, calibration, recompute, memory_limit, offload_dir,
                        offload_io)
    m, n, cal, g = st.machine, st.workers, st.calibration, st.graph
    t0 = time.perf_counter()
    p = predict(StepConfig(cfg, batch, seq, tiling, sched, n, recompute), m, cal, st.host_costs, graph=g,
                durations=st.durations, keep_result=True, transfers=transfers, seed=sched_seed, memory=st.forecast)
    sim_s = time.perf_counter() - t0
    s = p.summary
    return SimulateResult(cfg.name, batch, seq, tiling.describe(), m.name, sched, n, p.step_s, p.makespan_s,
                          p.host_s, p.host_known, host_note(p, m), p.tasks, p.tiles, s["utilization"],
                          s["critical_path_s"], s["work_bound_s"], p.tokens_per_s, p.task_overhead_s * 1e6,
                          "stored" if cal is not None else "none (machine roofline figures)", dict(s), p, g,
                          dict(st.provenance), sim_s)


@dataclass
class _PreparedStep:
    """What every prediction of one step shares whatever its policy: the machine, its worker count, the stored
    models, the graph, the memory forecast and the task durations (with where each came from)."""

    machine: object
    workers: int
    calibration: object
    host_costs: object
    limit: object
    graph: object
    forecast: object
    durations: object
    provenance: dict


def _prepared_step(cfg, batch, seq, tiling, machine, workers, calibration, recompute, memory_limit,
                   offload_dir, offload_io: str = "buffered") -> _PreparedStep:
    """Load the machine and its stored models (or ``calibration``'s file), check the memory limit, build the
    step's graph and compute its task durations on the machine as described, as the commands do."""
    from tilecast.graph.models import build_step
    from tilecast.graph.size_estimate import check_step_size
    from tilecast.loop.predict import stored_models
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.calibration import Calibration
    from tilecast.perfmodel.kernel_model import DurationModel
    from tilecast.perfmodel.machine import Machine

    m = machine if isinstance(machine, Machine) else load_machine(machine)
    n = len(m.workers) if workers is None else len(m.with_workers(workers).workers)
    cal, host_costs = stored_models(m)
    if calibration is not None:
        cal = Calibration.load(calibration, m.fingerprint())
    if offload_dir is not None and memory_limit is None:
        raise FieldError("offload_dir needs memory_limit")
    limit = None if memory_limit is None else _memory_limit(memory_limit, offload_dir, offload_io)
    check_step_size(cfg, batch, seq, tiling, recompute, "simulate")  # a step too large: refused before building
    g = build_step(cfg, batch, seq, tiling, recompute=recompute)
    forecast = None if limit is None else _memory_forecast(limit, m, g, n)
    model_ = DurationModel(m.with_workers(n), cal)  # as predict() has them for n workers (Calibration.arrays)
    return _PreparedStep(m, n, cal, host_costs, limit, g, forecast, model_.durations(g), dict(model_.provenance))


def _memory_limit(memory_limit, offload_dir, offload_io: str = "buffered"):
    """The MemoryLimit of ``memory_limit`` and ``offload_dir`` (an existing, writable directory), checked before
    anything is built."""
    from tilecast.executor.memory_limit import MemoryLimit, check_direct_io, check_offload_dir, parse_size

    if offload_io != "buffered" and offload_dir is None:
        raise FieldError("offload_io needs offload_dir")
    limit = MemoryLimit(parse_size(memory_limit), offload_dir, offload_io)
    if offload_dir is not None:
        check_offload_dir(offload_dir, 0)
        if offload_io == "direct":
            check_direct_io(offload_dir)
    return limit


def _one_memory_node(machine) -> None:
    """A memory limit is StarPU's limit on the CPU executor's main memory: refused, naming the field, for a
    machine of several memory nodes (a GPU server's description), which the limited simulation does not model."""
    if len(machine.nodes) != 1:
        raise FieldError(f"memory_limit: applies to a machine of one memory node (the CPU executor); {machine.name} "
                         f"has {len(machine.nodes)}")


def _memory_forecast(limit, machine, g, workers):
    """The simulator's MemoryForecast of ``limit`` for step ``g`` (the disk node measured in the offload directory
    if not yet); MemoryLimitError with the minimum for a limit below the step's smallest working set."""
    from tilecast.executor.memory_limit import MemoryLimitError, refusal
    from tilecast.perfmodel.disk_node import ensure_disk, for_offload_io
    from tilecast.simulator.memory_capacity import MemoryForecast

    why = refusal([g], workers, limit.limit_bytes, limit.offload_dir is not None)
    if why:
        raise MemoryLimitError(f"memory_limit: {why}")
    _one_memory_node(machine)
    disk = ensure_disk(machine, limit.offload_dir) if limit.offload_dir is not None else None
    return MemoryForecast(limit.limit_bytes, for_offload_io(disk, limit.offload_io))


# --- run ---------------------------------------------------------------------------------------------------
@dataclass
class RunResult(_Result):
    """Training steps executed on StarPU (``tilecast run``); medians over the steps after the first;
    ``to_frame()`` has one row per step, ``trace`` the last step's measured trace."""

    model: str
    batch: int
    seq: int
    tiling: str
    sched: str
    workers: int
    tasks: int
    steps: int
    step_s: float
    makespan_s: float
    host_s: float
    tokens_per_s: float
    gflops: float
    step_times_s: list
    makespans_s: list
    losses: list
    flops_per_step: float
    check: dict | None = None
    trace: object = field(repr=False, default=None)
    graph: object = field(repr=False, default=None)
    recompute: str = "none"
    disk_written_bytes: list = field(default_factory=list)  # per step, to StarPU's disk node (memory_limit)
    disk_read_bytes: list = field(default_factory=list)  # per step, back from it
    peak_rss_bytes: int = 0  # the process's peak resident set size after the run
    disk_writes: list = field(default_factory=list)  # per step, transfers (tiles) to the disk node
    disk_reads: list = field(default_factory=list)  # per step, transfers (tiles) back from it
    predicted: dict | None = None  # with forecast: the simulator's forecast of a step under the memory limit

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame({"step": range(1, len(self.step_times_s) + 1), "step_s": self.step_times_s,
                             "makespan_s": self.makespans_s, "loss": self.losses,
                             "tokens_per_s": [self.batch * self.seq / t for t in self.step_times_s],
                             "gflops": [self.flops_per_step / t / 1e9 for t in self.step_times_s]})

    def _headline(self) -> str:
        return (f"{self.model} {self.batch}x{self.seq} tile {self.tiling} on StarPU {self.sched}, "
                f"{self.workers} workers: {self.step_s * 1e3:.3f} ms a step")


def run(model="gpt2-tiny", batch: int = 4, seq: int = 64, tile="64", sched: str = "dmda",
        workers: int | None = None, steps: int = 3, seed: int = 0, check: bool = False,
        recompute: str = "none", memory_limit: str | int | None = None,
        offload_dir: str | None = None, progress=None, forecast: bool = False,
        offload_io: str = "buffered") -> RunResult:
    """Execute training steps on StarPU and time them (``tilecast run``); ``check`` compares the first step with
    the numpy reference (``check["ok"]``). ``memory_limit`` (bytes, or a size such as ``"512MiB"``) and
    ``offload_dir`` run with StarPU-managed tiles under a memory limit (docs/memory.md), ``offload_io`` saying how
    the disk node's files are written (``"buffered"`` or ``"direct"``: O_DIRECT); with ``forecast``,
    ``predicted`` is the simulator's forecast of a step of that run (``step_s``, disk bytes, evictions,
    write-backs, dropped; or ``error``). ``progress``: called after each step with (step index, its seconds,
    its loss)."""
    import numpy as np

    from tilecast.executor.memory_limit import MemoryLimit, parse_size

    from tilecast.executor.starpu_run import run_steps
    from tilecast.trace import with_step_time

    cfg, tiling = _config(model), _tiling(tile)
    _shape(cfg, batch, seq)
    _positive("steps", steps)
    if workers is not None:
        _positive("workers", workers)
    memory = None
    if offload_io != "buffered" and offload_dir is None:
        raise FieldError("offload_io needs offload_dir")
    if memory_limit is not None:
        memory = MemoryLimit(parse_size(memory_limit), offload_dir, offload_io)
    elif offload_dir is not None:
        raise FieldError("offload_dir needs memory_limit")
    res = run_steps(cfg, batch, seq, tiling, sched, workers, steps, seed=seed, check=check, recompute=recompute,
                    memory=memory, progress=progress)
    predicted = None
    if forecast and memory is not None and memory.offload_dir is not None:
        predicted = _limited_forecast(cfg, batch, seq, tiling, sched, len(res.workers), memory, recompute, res.graph)
    return RunResult(cfg.name, batch, seq, tiling.describe(), sched, len(res.workers), res.n_tasks, steps,
                     res.median_step_s, float(np.median(res.makespan_s[1:] or res.makespan_s)), res.host_s,
                     res.tokens_per_s, res.gflops, list(res.step_s), list(res.makespan_s), list(res.losses),
                     res.flops_per_step, res.check, with_step_time(res.trace, res.step_s[-1]), res.graph, recompute,
                     list(res.disk_written), list(res.disk_read), res.peak_rss_bytes, list(res.disk_writes),
                     list(res.disk_reads), predicted)


def _limited_forecast(cfg, batch, seq, tiling, sched, workers, memory, recompute, graph) -> dict:
    """The simulator's forecast of a step of a memory-limited run (``predicted`` in ``tilecast run --json``:
    step_s, disk_written_bytes, disk_read_bytes, evictions, writebacks, dropped per step), or {"error": why}."""
    from tilecast.executor.memory_limit import MemoryLimitError
    from tilecast.loop.predict_memory import predict_limited, predicted_fields
    from tilecast.perfmodel.disk_node import DiskNodeError
    from tilecast.simulator.engine import SimulationError

    try:
        return predicted_fields(predict_limited(cfg, batch, seq, tiling, sched, workers, memory.limit_bytes,
                                                memory.offload_dir, recompute, graph=graph,
                                                offload_io=memory.offload_io))
    except (SimulationError, MemoryLimitError, DiskNodeError, FieldError) as e:
        return {"error": f"not forecast: {e}"}


# --- compare -----------------------------------------------------------------------------------------------
@dataclass
class CompareResult(_Result):
    """A predicted trace against a measured one (``tilecast compare``); ``to_frame()`` is the error per kernel,
    ``write(folder)`` the HTML report; ``summary`` every figure of the command's ``--json``."""

    step_error: float | None
    makespan_error: float | None
    pred_step_s: float | None
    real_step_s: float | None
    pred_makespan_s: float
    real_makespan_s: float
    task_duration_error: float | None
    tasks_matched: int
    summary: dict = field(repr=False, default_factory=dict)
    comparison: object = field(repr=False, default=None)  # tilecast.reports.comparison.Comparison

    def to_frame(self):
        return self.comparison.by_kernel.copy()

    def write(self, folder: str, chrome: bool = True) -> dict:
        """Write the report folder (HTML page, Gantt and error plots, Chrome traces, summary JSON); its paths."""
        return self.comparison.write(folder, chrome=chrome)

    def _headline(self) -> str:
        err = self.step_error if self.step_error is not None else self.makespan_error
        what = "step" if self.step_error is not None else "makespan"
        return f"{what} error {100 * err:+.2f}%" if err is not None else "comparison"


def _trace_of(x):
    return x.trace() if isinstance(x, SimulateResult) else x.trace if isinstance(x, RunResult) else x


def compare(pred, real, before=None, check_sources: bool = True) -> CompareResult:
    """Compare a predicted trace with a measured one: each a trace DataFrame, a .parquet/.csv path, or a
    :func:`simulate` / :func:`run` result. ``before``: an earlier prediction of the same run."""
    from tilecast.reports import compare as compare_traces

    graph_ = next((x.graph for x in (real, pred) if isinstance(x, (SimulateResult, RunResult))), None)
    c = compare_traces(_trace_of(pred), _trace_of(real), check_sources=check_sources, graph=graph_,
                       before=None if before is None else _trace_of(before))
    s = c.summary()
    return CompareResult(s["step"]["error"], s["makespan"]["error"], s["step"]["pred_s"], s["step"]["real_s"],
                         s["makespan"]["pred_s"], s["makespan"]["real_s"], s["task_duration_error"]["median_error"],
                         s["tasks"]["matched"], s, c)
