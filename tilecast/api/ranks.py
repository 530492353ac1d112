"""``tc.run_ranks``, ``tc.train_ranks``, ``tc.simulate_ranks``, ``tc.tune_ranks``: a step on N StarPU-MPI ranks,
run, trained, predicted or ranked (the ``--ranks`` variants of ``run``, ``train``, ``simulate`` and ``tune``;
docs/mpi.md). Bad input raises a ValueError naming the argument (FieldError, ModelConfigError, TilingError,
MachineError, DataError, CheckpointError); a failed StarPU-MPI run raises ``MPIRunError``."""

from __future__ import annotations

from dataclasses import dataclass, field

from tilecast.api.base import _at_least, _config, _positive, _Result, _shape, _tiling
from tilecast.errors import FieldError


def _step(model, batch, seq, tile, recompute):
    """(config, tiling, recompute, graph) of the step, checked, and the graph built."""
    from tilecast.graph.models import build_step
    from tilecast.graph.recompute import check_recompute
    from tilecast.graph.size_estimate import check_step_size

    cfg, tiling = _config(model), _tiling(tile)
    _shape(cfg, batch, seq)
    recompute = check_recompute(recompute)
    check_step_size(cfg, batch, seq, tiling, recompute, "simulate")  # a step too large: refused before building
    return cfg, tiling, recompute, build_step(cfg, batch, seq, tiling, recompute=recompute)


def _distributed(graph, ranks, distribution) -> None:
    """FieldError naming ranks or distribution when the distribution cannot use ``ranks`` ranks."""
    from tilecast.graph.distribution import prepare

    _positive("ranks", ranks)
    prepare(graph, ranks, distribution)


def _positive_seconds(name: str, value) -> None:
    if not value > 0:
        raise FieldError(f"{name} must be positive, got {value}")


# --- run --ranks -------------------------------------------------------------------------------------------
@dataclass
class RanksRunResult(_Result):
    """Training steps on N StarPU-MPI processes (``tilecast run --ranks``): medians after the first step;
    ``to_frame()`` has one row per rank (tasks, bytes sent and received, measured and as StarPU-MPI's rules
    predict, the rank's step time), ``steps_frame()`` one per step; ``summary`` is ``run --ranks --json``
    (without ``blas`` and ``trace``), ``result`` the executor's ``MPIRunResult``."""

    model: str
    batch: int
    seq: int
    tiling: str
    sched: str
    ranks: int
    distribution: str
    workers_per_rank: int
    tasks: int
    steps: int
    step_s: float
    tokens_per_s: float
    losses: list
    bytes_moved: int
    bytes_moved_predicted: int
    check: dict | None = None
    summary: dict = field(repr=False, default_factory=dict)
    result: object = field(repr=False, default=None)

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.summary["per_rank"])

    def steps_frame(self):
        import pandas as pd

        r = self.result
        return pd.DataFrame({"step": range(1, len(r.step_s) + 1), "step_s": r.step_s,
                             "bytes_moved": r.bytes_moved,
                             "loss": list(r.losses) + [None] * (len(r.step_s) - len(r.losses))})

    def _headline(self) -> str:
        return (f"{self.model} {self.batch}x{self.seq} tile {self.tiling} on {self.ranks} StarPU-MPI ranks "
                f"({self.distribution}, {self.sched}): {self.step_s * 1e3:.3f} ms a step")


def run_ranks(model="gpt2-tiny", batch: int = 4, seq: int = 64, tile="64", sched: str = "dmda", workers: int = 1,
              steps: int = 3, ranks: int = 2, distribution: str = "data", seed: int = 0, check: bool = False,
              timeout_s: float = 600.0, recompute: str = "none", mpi_calls: bool = False) -> RanksRunResult | None:
    """Run ``steps`` training steps on ``ranks`` StarPU-MPI processes of ``workers`` CPU workers, started with
    mpirun (``tilecast run --ranks``); ``check`` compares the first step with the one-process numpy reference;
    ``mpi_calls`` times every MPI call of the ranks (``result.mpi_calls``, drawn in the merged trace; the steps
    run a little slower). Under an mpirun the caller started, ranks other than 0 return None (rank 0 reports)."""
    import numpy as np

    from tilecast.executor.mpi_launch import run_mpi

    cfg, tiling, recompute, g = _step(model, batch, seq, tile, recompute)
    _positive("steps", steps)
    _positive("workers", workers)
    _positive_seconds("timeout_s", timeout_s)
    _distributed(g, ranks, distribution)  # a rank count that does not fit: before any process starts
    res = run_mpi(cfg, batch, seq, tiling, sched, workers, steps, ranks, distribution, seed=seed, check=check,
                  timeout_s=timeout_s, recompute=recompute, mpi_calls=mpi_calls)
    if res is None:
        return None
    pred = res.predicted
    rows = [dict(rank=r, tasks=int(res.executed[r, -1]), tasks_predicted=p["tasks"],
                 bytes_sent=int(res.bytes_sent[-1][r].sum()), bytes_sent_predicted=p["bytes_sent"],
                 bytes_received=int(res.bytes_sent[-1][:, r].sum()), bytes_received_predicted=p["bytes_received"],
                 step_s=float(np.median(res.rank_step_s[r, 1:] if steps > 1 else res.rank_step_s[r])))
            for r, p in enumerate(pred["per_rank"])]
    tokens_per_s = res.tokens_per_step / res.median_step_s
    out = {"model": cfg.name, "batch": batch, "seq": seq, "tiling": str(tiling), "recompute": recompute,
           "sched": sched, "ranks": res.ranks, "distribution": res.distribution, "workers_per_rank": workers,
           "tasks": res.n_tasks, "steps": steps, "step_s": res.median_step_s, "step_times_s": res.step_s,
           "losses": res.losses, "bytes_moved": res.bytes_moved[-1], "bytes_moved_predicted": pred["bytes_moved"],
           "messages_predicted": pred["messages"], "per_rank": rows, "flops_per_step": res.flops_per_step,
           "tokens_per_s": tokens_per_s, "progress_drives_worker": res.progress_drives_worker,
           "main_thread_first": res.main_first}
    if res.check is not None:
        out["check"] = res.check
    return RanksRunResult(cfg.name, batch, seq, str(tiling), sched, res.ranks, res.distribution, workers, res.n_tasks,
                          steps, res.median_step_s, tokens_per_s, list(res.losses), res.bytes_moved[-1],
                          pred["bytes_moved"], res.check, out, res)


# --- train --ranks -----------------------------------------------------------------------------------------
@dataclass
class RanksTrainResult(_Result):
    """Training on N StarPU-MPI processes (``tilecast train --ranks``), each rank checkpointing the tiles it
    owns; ``to_frame()`` has one row per step run (``step``, ``loss``); ``summary`` is ``train --ranks --json``."""

    model: str
    batch: int
    seq: int
    tiling: str
    sched: str
    ranks: int
    distribution: str
    workers_per_rank: int
    start_step: int
    steps: int
    losses: list
    step_time_s: float
    tokens_per_s: float
    bytes_moved: int
    checkpoint: str | None
    summary: dict = field(repr=False, default_factory=dict)
    result: object = field(repr=False, default=None)

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame({"step": range(self.start_step + 1, self.start_step + len(self.losses) + 1),
                             "loss": self.losses})

    def _headline(self) -> str:
        return (f"{self.model} on {self.ranks} StarPU-MPI ranks: steps {self.start_step + 1}-{self.steps}, "
                f"{self.tokens_per_s:.0f} tokens/s")


def train_ranks(model="gpt2-tiny", batch: int = 16, seq: int = 128, tile="batch=4", steps: int = 1000,
                lr: float = 3e-3, sched: str = "eager", workers: int = 1, ranks: int = 2, distribution: str = "data",
                checkpoint: str | None = None, checkpoint_every: int = 0, resume: bool = False, seed: int = 0,
                timeout_s: float = 3600.0, recompute: str = "none") -> RanksTrainResult | None:
    """Train ``model`` (vocab_size 256: the byte corpus) on ``ranks`` StarPU-MPI processes until step ``steps``
    (``tilecast train --ranks``); ``checkpoint`` is a directory: each rank writes the parameter and AdamW
    tiles it owns, rank 0 a ``manifest.json``; ``resume`` continues from it. None on ranks other than 0
    under an mpirun the caller started."""
    import os

    from tilecast.data.corpus import VOCAB_SIZE, load_corpus
    from tilecast.data.mpi_checkpoint import read_manifest
    from tilecast.executor.mpi_launch import run_mpi

    cfg, tiling, recompute, g = _step(model, batch, seq, tile, recompute)
    if cfg.vocab_size != VOCAB_SIZE:
        raise FieldError(f"model: vocab_size must be {VOCAB_SIZE} to train on the byte corpus, got {cfg.vocab_size}")
    _at_least("steps", steps, 1)
    _at_least("checkpoint_every", checkpoint_every, 0)
    _positive("workers", workers)
    _positive_seconds("timeout_s", timeout_s)
    if (resume or checkpoint_every) and not checkpoint:
        raise FieldError(f"{'resume' if resume else 'checkpoint_every'} needs a checkpoint path")
    _distributed(g, ranks, distribution)
    corpus = load_corpus()
    settings = {"model": cfg.to_dict(), "tiling": str(tiling), "batch": batch, "seq": seq, "seed": seed, "lr": lr,
                "ranks": ranks, "distribution": distribution, "corpus": corpus.key, "recompute": recompute}
    start = 0
    folder = os.path.abspath(checkpoint) if checkpoint else None
    if folder and resume:
        start = int(read_manifest(folder, settings)["step"])
    elif folder:
        if os.path.exists(os.path.join(folder, "manifest.json")):
            raise FieldError(f"checkpoint: {folder} holds a checkpoint; resume it or choose another folder")
        os.makedirs(folder, exist_ok=True)
    if start >= steps:
        raise FieldError(f"steps: the checkpoint is at step {start}; ask for more than {start} steps")
    train = {"folder": folder, "resume": bool(resume), "every": checkpoint_every, "settings": settings}
    res = run_mpi(cfg, batch, seq, tiling, sched, workers, steps - start, ranks, distribution, seed=seed, lr=lr,
                  timeout_s=timeout_s, recompute=recompute, train=train)
    if res is None:
        return None
    manifest = os.path.join(folder, "manifest.json") if folder else None
    out = {"model": cfg.name, "batch": batch, "seq": seq, "tiling": str(tiling), "sched": sched, "ranks": res.ranks,
           "distribution": res.distribution, "workers_per_rank": workers, "start_step": start, "steps": steps,
           "losses": res.losses, "final_train_loss": res.losses[-1] if res.losses else None,
           "step_time_s": res.median_step_s, "tokens_per_s": res.tokens_per_step / res.median_step_s,
           "bytes_moved": res.bytes_moved[-1], "checkpoint": manifest}
    return RanksTrainResult(cfg.name, batch, seq, str(tiling), sched, res.ranks, res.distribution, workers, start,
                            steps, list(res.losses), res.median_step_s, out["tokens_per_s"], res.bytes_moved[-1],
                            manifest, out, res)


# --- simulate --ranks and tune --ranks: the network and the machine ------------------------------------------
def network_of(network, machine, ranks: int, workers: int):
    """The network between the ranks: a :class:`tilecast.perfmodel.network.Network`, a (latency us, cost per
    message us, bandwidth GB/s) triple, or None for the one ``tilecast calibrate --ranks`` stored."""
    from tilecast.loop.ranks_forecast import network_or_error
    from tilecast.perfmodel.network import Network

    if isinstance(network, Network):
        return network
    if network is None:
        try:
            return network_or_error(machine, ranks, workers)
        except LookupError as e:
            raise FieldError(f"ranks: {e} (or give the network)") from None
    try:
        lat, msg, gbps = (float(x) for x in network)
    except (TypeError, ValueError):
        raise FieldError(f"network: expected (latency us, cost per message us, bandwidth GB/s), got {network!r}") \
            from None
    # a figure out of range: FieldError "network bandwidth_Bps must be ..."
    return Network(latency_s=lat * 1e-6, message_s=msg * 1e-6, bandwidth_Bps=gbps * 1e9, source="given",
                   ranks=ranks, workers_per_rank=workers)


def _rank_machine(machine, workers: int):
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.machine import Machine

    _positive("workers", workers)
    m = machine if isinstance(machine, Machine) else load_machine(machine)
    m.with_workers(workers)  # MachineError naming the workers the machine has
    return m


def _background(background_threads) -> float:
    if not background_threads >= 0:
        raise FieldError(f"background_threads: expected a number of threads >= 0, got {background_threads}")
    return float(background_threads)


def _calibration_note(calibration) -> str:
    return "stored" if calibration is not None else "none (machine roofline figures)"


# --- simulate --ranks --------------------------------------------------------------------------------------
@dataclass
class RanksSimulateResult(_Result):
    """A step predicted on N StarPU-MPI ranks (``tilecast simulate --ranks``); ``to_frame()`` has one row per
    rank (tasks, busy and end times, bytes sent and received, link busy time); ``summary`` is
    ``simulate --ranks --json``; ``forecast`` the :class:`tilecast.loop.ranks_forecast.RankForecast`."""

    model: str
    batch: int
    seq: int
    tiling: str
    machine: str
    sched: str
    ranks: int
    distribution: str
    workers_per_rank: int
    step_s: float
    tasks: int
    bytes_moved: int
    messages: int
    calibration: str
    summary: dict = field(repr=False, default_factory=dict)
    forecast: object = field(repr=False, default=None)

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.summary["per_rank"])

    def _headline(self) -> str:
        return (f"{self.model} {self.batch}x{self.seq} tile {self.tiling} on {self.ranks} ranks of "
                f"{self.workers_per_rank} worker(s) of {self.machine}: predicted step {self.step_s * 1e3:.3f} ms")


def simulate_ranks(model="gpt2", batch: int = 4, seq: int = 256, tile="256", machine="local", sched: str = "dmda",
                   ranks: int = 2, distribution: str = "data", workers: int = 1, network=None,
                   background_threads: float = 0.0, recompute: str = "none", progress=None) -> RanksSimulateResult:
    """Predict one step on ``ranks`` StarPU-MPI ranks of ``workers`` workers of ``machine`` joined by ``network``
    (:func:`network_of`; default: the stored one) with ``background_threads`` runnable threads of other work
    (``tilecast simulate --ranks``); ``progress``: called once with a line saying what is simulated."""
    import time

    from tilecast.loop.predict import stored_models
    from tilecast.loop.ranks_forecast import forecast_ranks

    cfg, tiling, recompute, g = _step(model, batch, seq, tile, recompute)
    _distributed(g, ranks, distribution)  # before anything else
    m = _rank_machine(machine, workers)
    net = network_of(network, m, ranks, workers)
    background = _background(background_threads)
    calibration, host_costs = stored_models(m)
    if progress is not None:
        progress(f"simulating {cfg.name} on {ranks} ranks of {workers} worker(s), distribution {distribution}, "
                 f"{sched} on each")
    t0 = time.perf_counter()
    f = forecast_ranks(cfg, batch, seq, tiling, sched, ranks, distribution, m, calibration, host_costs, net,
                       workers, recompute, built=g, background=background)
    out = {**f.row(), "makespan_s": f.step_s, "machine": m.name, "calibration": _calibration_note(calibration),
           "task_overhead_us": f.summary["task_overhead_s"] * 1e6, "network": f.summary["network"],
           "bytes_matrix": f.summary["bytes_matrix"], "utilization": f.summary["utilization"],
           "per_rank": f.summary["per_rank"], "threads": f.summary.get("threads"), "nic": f.summary.get("nic"),
           "simulation_s": time.perf_counter() - t0}
    return RanksSimulateResult(cfg.name, batch, seq, tiling.describe(), m.name, sched, ranks, distribution, workers,
                               f.step_s, f.tasks, f.bytes_moved, f.messages, out["calibration"], out, f)


# --- tune --ranks ------------------------------------------------------------------------------------------
@dataclass
class RanksTuneResult(_Result):
    """Tilings x distributions x policies ranked on N StarPU-MPI ranks by the rank simulator (``tilecast tune
    --ranks``); ``to_frame()`` is the ranking, best first; ``summary`` is ``tune --ranks --json``."""

    model: str
    batch: int
    seq: int
    machine: str
    ranks: int
    workers_per_rank: int
    configurations: int
    skipped: list
    calibration: str
    ranking: list = field(repr=False, default_factory=list)
    summary: dict = field(repr=False, default_factory=dict)

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.ranking)

    def _headline(self) -> str:
        best = self.ranking[0] if self.ranking else {}
        return (f"{self.model} {self.batch}x{self.seq} on {self.ranks} ranks: {self.configurations} configurations; "
                f"best {best.get('label')} {best.get('distribution')} {best.get('sched')}")


def tune_ranks(model="gpt2", batch: int = 4, seq: int = 256, machine="local", ranks: int = 2, tiles=None,
               scheds=("eager", "lws", "dmda", "dmdas"), distributions=("data", "layer", "cyclic"), workers: int = 1,
               max_tasks: int | None = None, network=None, background_threads: float = 0.0,
               recompute: str = "none", progress=None) -> RanksTuneResult:
    """Rank every tiling (``tiles``: specs or Tilings; None: the candidate tilings of ``tilecast tune``) x
    ``distributions`` x ``scheds`` on ``ranks`` ranks of ``workers`` workers by simulation (``tilecast tune
    --ranks``); a tiling a distribution cannot spread over the ranks is listed in ``skipped``. ``progress``:
    called with 1 after each configuration and the total as second argument."""
    from tilecast.graph.distribution import DISTRIBUTIONS
    from tilecast.graph.recompute import check_recompute
    from tilecast.loop.candidates import short_label
    from tilecast.loop.predict import stored_models
    from tilecast.loop.ranks_forecast import forecast_ranks
    from tilecast.loop.tune import DEFAULT_MAX_TASKS, build_candidates, usable_scheds

    cfg = _config(model)
    _shape(cfg, batch, seq)
    recompute = check_recompute(recompute)
    _at_least("ranks", ranks, 2)
    max_tasks = DEFAULT_MAX_TASKS if max_tasks is None else _positive("max_tasks", max_tasks)
    dists = list(distributions)
    bad = [d for d in dists if d not in DISTRIBUTIONS]
    if bad or not dists:
        raise FieldError(f"distributions: unknown distribution {bad[0] if bad else 'none'!r}; choose from "
                         f"{', '.join(DISTRIBUTIONS)}")
    m = _rank_machine(machine, workers)
    usable = usable_scheds(list(scheds))
    if not usable:
        raise FieldError("scheds: none of them is both simulated and offered by StarPU")
    net = network_of(network, m, ranks, workers)
    background = _background(background_threads)
    calibration, host_costs = stored_models(m)
    tilings = None if tiles is None else [_tiling(t) for t in tiles]
    graphs, skipped = build_candidates(cfg, batch, seq, tilings, max_tasks, recompute)
    total = len(graphs) * len(dists) * len(usable)
    rows = []
    for tiling, g in graphs:
        for d in dists:
            for s in usable:
                if progress is not None:
                    progress(1, total)
                try:
                    f = forecast_ranks(cfg, batch, seq, tiling, s, ranks, d, m, calibration, host_costs, net,
                                       workers, recompute, built=g, background=background)
                except FieldError as e:
                    if e.field != "ranks":
                        raise
                    # the distribution cannot use that many ranks with this tiling
                    skipped.append({"tiling": tiling.describe(), "distribution": d, "reason": e.detail})
                    break
                rows.append(f.row() | {"label": short_label(tiling)})
    rows.sort(key=lambda r: (r["pred_step_s"], r["bytes_moved"], r["tasks"], r["label"], r["distribution"]))
    out = {"model": cfg.name, "batch": batch, "seq": seq, "recompute": recompute, "machine": m.name, "ranks": ranks,
           "workers_per_rank": workers, "configurations": len(rows), "skipped": skipped,
           "calibration": _calibration_note(calibration),
           "network": {"latency_s": net.latency_s, "message_s": net.message_s, "bandwidth_Bps": net.bandwidth_Bps,
                       "source": net.source},
           "ranking": rows}
    return RanksTuneResult(cfg.name, batch, seq, m.name, ranks, workers, len(rows), skipped, out["calibration"],
                           rows, out)
