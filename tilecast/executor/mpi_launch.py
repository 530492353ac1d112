"""Training steps on StarPU-MPI: N rank processes started with ``mpirun``, their results gathered.

:func:`run_mpi` validates the run, builds the native code once, writes the
run's description to a directory under ``$TILECAST_HOME/mpi-runs``, starts
``mpirun -np N python -m tilecast.executor.mpi_rank`` (or, under an
``mpirun`` the user started, runs this process as one of the ranks), and
gathers what every rank wrote (:mod:`tilecast.executor.mpi_rank`): step times
(slowest rank), bytes each rank sent (StarPU-MPI's own count,
``STARPU_COMM_STATS``) beside the bytes the insert-task model predicts
(:mod:`tilecast.graph.owner_computes`), the last step's tasks with their
rank, and with ``check`` the first step compared with the numpy reference.
A rank that fails or dies ends the run (``mpirun`` ends the others; a
timeout ends ``mpirun``): :class:`MPIRunError`, one line.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tilecast.executor.mpi_call_times import FILE as CALLS_FILE
from tilecast.executor.mpi_rank import RESULT
from tilecast.home import home
from tilecast.errors import FieldError

DEFAULT_TIMEOUT_S = 600.0


class MPIRunError(RuntimeError):
    """The StarPU-MPI run failed (one line: which rank and why, or the timeout)."""


@dataclass
class MPIRunResult:
    ranks: int
    distribution: str
    step_s: list[float]  # per step: the slowest rank's time from the barrier to all tasks and messages done
    rank_step_s: np.ndarray  # (ranks, steps)
    losses: list[float]
    bytes_sent: np.ndarray  # (steps, ranks, ranks): StarPU-MPI's count of bytes sent from row to column rank
    predicted: dict  # tilecast.graph.owner_computes.rank_figures
    executed: np.ndarray  # (ranks, steps) tasks each rank ran
    n_tasks: int
    tokens_per_step: int
    flops_per_step: float
    task_rank: np.ndarray  # per task of the last step: the rank that ran it (measured)
    start_s: np.ndarray  # per task of the last step, seconds from its rank's exit of the step's first barrier
    end_s: np.ndarray
    worker: np.ndarray
    graph: object = None
    check: dict | None = None
    launcher: list[str] = field(default_factory=list)
    submit_s: np.ndarray | None = None  # (ranks, steps) seconds each rank spent submitting the graph
    submit_cpu_s: np.ndarray | None = None  # (ranks, steps) CPU seconds of each rank's main thread while submitting
    # (ranks, tasks + 1): when each rank's main thread began submitting the last step (column 0) and had inserted
    # task i (column i + 1), seconds from its exit of the step's first barrier
    submit_at_s: np.ndarray | None = None
    progress_drives_worker: bool = False  # StarPU-MPI's progress thread ran worker 0 (executor/mpi_threads.py)
    main_first: bool = False  # every rank's main thread ran pinned, its other threads below it (mpi_threads.py)
    # per rank, its threads over each step (barrier's exit to wait_all's end): {"name": [...], "run_s": (steps,
    # threads) seconds on a core, "wait_s": seconds runnable but waiting for one, "submit": the same from the
    # barrier's exit to the submission's end} (mpi_threads.thread_times)
    threads: list | None = None
    # per rank: its exit of the last step's first barrier on CLOCK_MONOTONIC, less rank 0's, in seconds (None when
    # a rank ran on another host or did not record it). start_s/end_s/submit_at_s + it: every rank on one clock.
    clock_shift_s: np.ndarray | None = None
    # per rank (``run_mpi(mpi_calls=True)``): its MPI calls (tilecast.executor.mpi_call_times.CALL records with
    # ``t_s``, seconds on the clock of start_s/end_s); None when not asked
    mpi_calls: list | None = None
    mpi_call_cost_s: np.ndarray | None = None  # per rank: what recording one of those calls cost it

    @property
    def median_step_s(self) -> float:
        steps = self.step_s[1:] or self.step_s
        return float(np.median(steps))

    @property
    def bytes_moved(self) -> list[int]:
        """Bytes moved between ranks, per step (StarPU-MPI's count)."""
        return [int(m.sum()) for m in self.bytes_sent]


def under_mpirun() -> bool:
    """Is this process one of an MPI job's ranks (started by mpirun)?"""
    return any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"))


def mpirun_command(ranks: int) -> list[str]:
    """The launcher and its options: ranks may outnumber cores (--oversubscribe), no binding by Open MPI
    (each rank binds its StarPU workers, mpi_rank.set_binding), root allowed when running as root."""
    mpirun = shutil.which("mpirun")
    if not mpirun:
        raise MPIRunError("mpirun not found: install Open MPI (apt-get install openmpi-bin libopenmpi-dev)")
    cmd = [mpirun, "-np", str(ranks), "--oversubscribe", "--bind-to", "none"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


def _spec(cfg, batch, seq, tiling, sched, workers, steps, ranks, distribution, seed, lr, check, timeout_s,
          run_dir, recompute="none", train=None) -> dict:
    return dict(model=cfg.to_dict(), batch=batch, seq=seq, tiling=str(tiling), sched=sched, workers=workers,
                steps=steps, ranks=ranks, distribution=distribution, seed=seed, lr=lr, check=check,
                timeout_s=timeout_s, run_dir=str(run_dir), ranks_per_host=ranks, recompute=recompute, train=train)


def _failure_line(text: str, returncode: int) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().strip("-")]
    ours = [ln for ln in lines if ln.startswith("tilecast rank")]
    if ours:
        return ours[0]
    # a rank's Python that failed before it could say so (its interpreter's last line: "ModuleNotFoundError: ...")
    python = [ln for ln in lines if re.match(r"^(/\S+: )?[A-Za-z_.]*(Error|Exception)\b.*: ", ln)]
    if python:
        return f"a rank failed (mpirun exit status {returncode}): {python[0]}"
    said = [ln for ln in lines if ln.startswith(("mpirun noticed", "mpirun detected")) or "signal" in ln.lower()]
    detail = said[0] if said else (lines[-1] if lines else "no output")
    return f"a rank failed (mpirun exit status {returncode}): {detail}"


def _launch(spec_path: Path, ranks: int, timeout_s: float, module: str = "tilecast.executor.mpi_rank",
            env_extra: dict | None = None) -> list[str]:
    """Run ``python -m module SPEC`` on ``ranks`` processes under mpirun; MPIRunError (one line) on a failure."""
    cmd = mpirun_command(ranks) + [sys.executable, "-m", module, str(spec_path)]
    env = dict(os.environ, **(env_extra or {}))
    env.setdefault("OMPI_MCA_btl_vader_single_copy_mechanism", "none")  # no ptrace in containers
    env["TILECAST_HOME"] = str(home())
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True, preexec_fn=_end_with_parent)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _end(proc)
        raise MPIRunError(f"the {ranks} ranks did not finish within {timeout_s:.0f} s (timeout_s); every process "
                          f"was ended") from None
    except BaseException:
        _end(proc)
        raise
    if proc.returncode != 0:
        raise MPIRunError(_failure_line(out, proc.returncode))
    return cmd


def _end_with_parent() -> None:
    """In the child before exec: SIGTERM to mpirun when this process dies, even killed (Linux prctl)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _end(proc) -> None:
    """End mpirun and its ranks: SIGTERM (mpirun passes it on), then SIGKILL to the whole session."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _gather(graph, owner, run_dir: Path, ranks: int, steps: int, want_snapshot: bool):
    files = [np.load(run_dir / RESULT.format(r)) for r in range(ranks)]
    rank_step_s = np.stack([f["step_s"] for f in files])
    submit_s = np.stack([f["submit_s"] for f in files])
    submit_cpu_s = np.stack([f["submit_cpu_s"] for f in files]) if all("submit_cpu_s" in f for f in files) else None
    sent = np.stack([f["sent"] for f in files], axis=1)  # (steps, src, dst)
    executed = np.stack([f["executed"] for f in files])
    loss_rank = int(owner[graph.tensor("loss").first_tile])
    n = graph.n_tasks
    task_rank = np.full(n, -1, dtype=np.int32)
    start, end, worker = np.full(n, np.nan), np.full(n, np.nan), np.full(n, -1, dtype=np.int64)
    # StarPU 1.3's clock starts at each process's own starpu_init (_starpu_clock_gettime subtracts
    # _starpu_reference_start_time_ts, src/common/timing.c), so ranks' times are not comparable: each rank's
    # times are taken from its own exit of the barrier that starts the step (the ranks leave it together)
    for r, f in enumerate(files):
        t0 = float(f["t0_us"][0])
        task_rank[f["task"]] = r
        start[f["task"]] = (f["start_us"] - t0) * 1e-6
        end[f["task"]] = (f["end_us"] - t0) * 1e-6
        worker[f["task"]] = f["worker"]
    submit_at = (np.stack([(f["submit_at_us"] - float(f["t0_us"][0])) * 1e-6 for f in files])
                 if all("submit_at_us" in f for f in files) else None)
    clock_shift = None
    if all("clock_offset_us" in f and "host" in f for f in files) and len({str(f["host"][0]) for f in files}) == 1:
        at = np.array([float(f["t0_us"][0]) + float(f["clock_offset_us"][-1]) for f in files])
        clock_shift = (at - at[0]) * 1e-6
    store = None
    if want_snapshot:
        from tilecast.reference.tiles import TileStore

        store = TileStore(graph)
        for f in files:
            vals, pos = f["owned_values"], 0
            for tid in f["owned"].tolist():
                size = int(graph.tile_nbytes[tid] // graph.tensors[graph.tile_tensor[tid]].dtype.itemsize)
                store.buffers[tid] = vals[pos:pos + size].astype(graph.tensors[graph.tile_tensor[tid]].dtype)
                pos += size
    drives = all(bool(f["drives"][0]) for f in files if "drives" in f)
    main_first = all("main_first" in f and bool(f["main_first"][0]) for f in files)
    mpi_calls = mpi_call_cost = None
    calls_there = all((run_dir / CALLS_FILE.format(r)).exists() for r in range(ranks))
    if calls_there and all("clock_offset_us" in f for f in files):
        from tilecast.executor.mpi_call_times import on_trace_clock, read_calls

        # the trace's origin on CLOCK_MONOTONIC: the rank's exit of the last step's barrier, its StarPU clock offset
        read = [read_calls(run_dir / CALLS_FILE.format(r)) for r in range(ranks)]
        mpi_calls = [on_trace_clock(calls, float(f["t0_us"][0]) + float(f["clock_offset_us"][-1]))
                     for (calls, _), f in zip(read, files)]
        mpi_call_cost = np.array([cost for _, cost in read])
    threads = ([{"name": f["thread_name"].tolist(), "run_s": f["thread_run_s"], "wait_s": f["thread_wait_s"],
                 "submit": {"name": f["submit_thread_name"].tolist(), "run_s": f["submit_thread_run_s"],
                            "wait_s": f["submit_thread_wait_s"]}}
                for f in files] if all("submit_thread_run_s" in f for f in files) else None)
    return dict(drives=drives, main_first=main_first, threads=threads, rank_step_s=rank_step_s, submit_s=submit_s, submit_cpu_s=submit_cpu_s,
                submit_at=submit_at, clock_shift=clock_shift, mpi_calls=mpi_calls, mpi_call_cost=mpi_call_cost,
                sent=sent, executed=executed, losses=files[loss_rank]["losses"].tolist(),
                task_rank=task_rank, start=start, end=end, worker=worker, store=store)


def run_mpi(cfg, batch: int, seq: int, tiling, sched: str = "dmda", workers: int = 1, steps: int = 2,
            ranks: int = 2, distribution: str = "data", seed: int = 0, lr: float = 1e-3, check: bool = False,
            timeout_s: float = DEFAULT_TIMEOUT_S, recompute: str = "none", train: dict | None = None,
            progress: str = "auto", read_threads: bool = False, main_first: bool = True,
            mpi_calls: bool = False) -> MPIRunResult:
    """Run ``steps`` training steps of ``cfg`` on ``ranks`` StarPU-MPI processes of ``workers`` CPU workers.

    ``train``: batches from the byte corpus instead of random tokens, and checkpoints
    (:mod:`tilecast.data.mpi_checkpoint`): ``folder`` (or None), ``resume``, ``every`` (steps),
    ``settings`` (what a resumed checkpoint must match). ``progress``: ``auto`` lets StarPU-MPI's progress
    thread run worker 0 where the ranks' threads would outnumber the cores, ``own`` always gives it a
    thread of its own (:mod:`tilecast.executor.mpi_threads`). ``main_first``: where each rank's workers have
    cores of their own, its main thread runs on its first worker's core and every other thread of the rank
    below it, so that it submits the step uncut (:func:`tilecast.executor.mpi_threads.main_thread_first`;
    False: every thread at the same level, unpinned). ``read_threads``: each rank reads its threads'
    scheduler counts at each step's start, submission's end and end (``MPIRunResult.threads``; 0.1-0.3 ms of
    the main thread per reading, inside the step: off unless asked). ``mpi_calls``: time every MPI call of the
    ranks (:mod:`tilecast.executor.mpi_call_times`; ``MPIRunResult.mpi_calls``; not under a user's mpirun).

    FieldError (naming the field) on bad input, before anything starts;
    :class:`MPIRunError` when mpirun is missing, a rank fails, or the run
    outlives ``timeout_s``.
    """
    from tilecast.executor.mpi_native import mpi_glue
    from tilecast.executor.starpu_session import max_workers, policies
    from tilecast.graph.distribution import prepare
    from tilecast.graph.gpt2 import AdamWConfig
    from tilecast.graph.models import build_step
    from tilecast.graph.owner_computes import rank_figures
    from tilecast.kernels.native import kernel_addresses

    if steps < 1:
        raise FieldError(f"steps must be at least 1, got {steps}")
    if not under_mpirun():
        mpirun_command(ranks)  # a missing mpirun: one line before anything is built
    if not 1 <= workers <= max_workers():
        raise FieldError(f"workers must be between 1 and {max_workers()} (this StarPU's limit), got {workers}")
    if sched not in policies():
        raise FieldError(f"sched: unknown scheduler {sched!r}; this StarPU offers: {', '.join(sorted(policies()))}")
    if timeout_s <= 0:
        raise FieldError(f"timeout_s must be positive, got {timeout_s}")
    if progress not in ("auto", "own"):
        raise FieldError(f"progress must be 'auto' or 'own', got {progress!r}")
    if mpi_calls and under_mpirun():
        raise FieldError("mpi_calls: not under an mpirun you started (the call timer is preloaded into the ranks "
                         "that tilecast launches)")
    built = build_step(cfg, batch, seq, tiling, AdamWConfig(lr=lr), recompute=recompute)
    graph, dist = prepare(built, ranks, distribution)  # FieldError when the ranks do not fit
    predicted = rank_figures(graph, dist)
    kernel_addresses()  # build both extensions here, once, rather than in every rank at the same time
    mpi_glue()
    root = home("mpi-runs")
    root.mkdir(parents=True, exist_ok=True)
    bottom = _bottom_levels(graph, sched)
    if under_mpirun():
        return _run_as_rank(cfg, batch, seq, tiling, sched, workers, steps, ranks, distribution, seed, lr, check,
                            timeout_s, graph, dist, predicted, root, bottom, built, recompute, train, progress,
                            main_first)
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=root))
    try:
        spec = _spec(cfg, batch, seq, tiling, sched, workers, steps, ranks, distribution, seed, lr, check,
                     timeout_s, run_dir, recompute, train)
        spec["progress"] = progress
        spec["main_first"] = bool(main_first)
        spec["read_threads"] = read_threads
        if bottom is not None:
            np.save(run_dir / "bottom_level.npy", bottom)
            spec["bottom_level"] = str(run_dir / "bottom_level.npy")
        spec_path = run_dir / "spec.json"
        spec_path.write_text(json.dumps(spec))
        env_extra = None
        if mpi_calls:
            from tilecast.executor.mpi_call_times import launch_env

            env_extra = launch_env(run_dir)
        cmd = _launch(spec_path, ranks, timeout_s, env_extra=env_extra)
        got = _gather(graph, dist.owner, run_dir, ranks, steps, check)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return _result(cfg, batch, seq, steps, ranks, distribution, seed, lr, check, graph, dist, predicted, got, cmd,
                   built)


def _bottom_levels(graph, sched: str):
    """The tasks' bottom levels for the policies that use priorities (the same weights as a one-process run,
    tilecast.executor.starpu_execute.graph_priorities), else None."""
    from tilecast.graph.priorities import USES_PRIORITIES, bottom_level

    if sched not in USES_PRIORITIES:
        return None
    from tilecast.executor.starpu_execute import local_priority_weights

    pred_ptr, pred = graph.dependencies
    return bottom_level(local_priority_weights(graph), pred_ptr, pred)


def _run_as_rank(cfg, batch, seq, tiling, sched, workers, steps, ranks, distribution, seed, lr, check, timeout_s,
                 graph, dist, predicted, root, bottom, built, recompute, train=None, progress="auto",
                 main_first=True):
    """Under a user's mpirun: this process is one rank; rank 0 gathers and returns the result, others None."""
    from tilecast.executor.mpi_rank import run_rank

    job = os.environ.get("OMPI_MCA_ess_base_jobid") or os.environ.get("PMI_JOBID") or "job"
    run_dir = root / f"job-{job}"
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = _spec(cfg, batch, seq, tiling, sched, workers, steps, ranks, distribution, seed, lr, check, timeout_s,
                 run_dir, recompute, train)
    spec["ranks_per_host"] = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", ranks))
    spec["progress"] = progress
    spec["main_first"] = bool(main_first)
    me = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", str(ranks))))
    if size != ranks:
        raise FieldError(f"ranks: mpirun started {size} processes, not {ranks}")
    try:
        run_rank(spec, bottom)  # ends with a barrier once every rank's file is written
    except Exception as e:  # this process exits without MPI_Finalize: mpirun then ends the other ranks
        raise MPIRunError(f"rank {me}: {type(e).__name__}: {e}") from None
    if me != 0:
        return None
    try:
        got = _gather(graph, dist.owner, run_dir, ranks, steps, check)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return _result(cfg, batch, seq, steps, ranks, distribution, seed, lr, check, graph, dist, predicted, got,
                   ["(user's mpirun)"], built)


def _result(cfg, batch, seq, steps, ranks, distribution, seed, lr, check, graph, dist, predicted, got, cmd, built):
    report = None
    if check:
        report = check_first_step(cfg, batch, seq, built, seed, got["store"], steps)
    return MPIRunResult(
        ranks=ranks, distribution=distribution, step_s=got["rank_step_s"].max(axis=0).tolist(),
        rank_step_s=got["rank_step_s"], losses=got["losses"], bytes_sent=got["sent"], predicted=predicted,
        executed=got["executed"], n_tasks=graph.n_tasks, tokens_per_step=batch * seq,
        flops_per_step=float(graph.flops.sum()), task_rank=got["task_rank"], start_s=got["start"],
        end_s=got["end"], worker=got["worker"], graph=graph, check=report, launcher=cmd, submit_s=got["submit_s"],
        submit_cpu_s=got["submit_cpu_s"], submit_at_s=got.get("submit_at"), progress_drives_worker=got["drives"],
        main_first=got["main_first"],
        threads=got.get("threads"), clock_shift_s=got.get("clock_shift"), mpi_calls=got.get("mpi_calls"),
        mpi_call_cost_s=got.get("mpi_call_cost"))


def check_first_step(cfg, batch, seq, graph, seed, store, steps) -> dict:
    """The first step's loss, gradients and parameters (gathered from their owners into ``store``) against
    the numpy reference execution of ``graph``, the step as built (before a distribution rewrote it), with
    the tolerances of ``tilecast run --check`` (tilecast.executor.starpu_run.check_step)."""
    from tilecast.executor.starpu_run import adamw_expected, check_step
    from tilecast.reference.step import TrainState, init_params, reference_step
    from tilecast.graph.gpt2 import grad_name

    params = init_params(cfg, seed)
    data = np.random.default_rng(seed).integers(0, cfg.vocab_size, size=(steps, batch, seq + 1))
    got = (float(store.tensor("loss")[0]), {n: store.tensor(grad_name(n)) for n in params},
           {n: store.tensor(n) for n in params})
    ref_state = TrainState({k: v.copy() for k, v in params.items()})
    ref = reference_step(graph, ref_state, data[0, :, :-1], data[0, :, 1:])
    return check_step(*got, (ref.loss, ref.grads, ref_state.params), adamw_expected(graph, params, got[1]))
