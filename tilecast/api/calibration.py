"""``tc.calibrate`` and ``tc.calibrate_network``: time this machine's kernels (and its disk node), or the
network between StarPU-MPI ranks, and store the models simulate and tune use (``tilecast calibrate``,
``tilecast calibrate --ranks``). Bad input raises a ValueError naming the argument (FieldError, TilingError,
ModelConfigError, DiskNodeError); a timer that cannot run here raises ``NativeUnavailable``; a failed
ping-pong ``MPIRunError``."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field

from tilecast.api.base import _at_least, _config, _Result, _shape, _tiling
from tilecast.errors import FieldError

TIMERS = ("auto", "starpu", "c", "numpy")


def blas_fields() -> dict:
    """The C kernels' BLAS as a command's ``blas`` key, or {"error": why} where it cannot be loaded."""
    from tilecast.kernels.blas import blas_info
    from tilecast.kernels.native_build import NativeUnavailable

    try:
        return blas_info().to_dict()
    except NativeUnavailable as e:
        return {"error": str(e)}


@dataclass
class CalibrateResult(_Result):
    """A calibration of this machine's kernels (``tilecast calibrate``): the shapes timed and predicted, the
    file written, and each kernel model's error on timed shapes held out of its fit; ``to_frame()`` has one
    row per kernel and lane (cold, hot); ``summary`` is ``calibrate --json`` (keys and units in docs/cli.md);
    ``calibration`` the :class:`tilecast.perfmodel.calibration.Calibration` stored."""

    machine: str
    fingerprint: str
    timer: str | None = None
    file: str | None = None
    shapes: int = 0
    shapes_seen: int = 0
    shapes_predicted: int = 0
    kernels: int = 0
    cache_bytes: int | None = None
    disk: dict = field(default_factory=dict)
    executor_costs: dict = field(default_factory=dict)  # by worker count: microseconds and milliseconds
    summary: dict = field(repr=False, default_factory=dict)
    calibration: object = field(repr=False, default=None)
    disk_node: object = field(repr=False, default=None)  # tilecast.perfmodel.disk_node.DiskNode

    def to_frame(self):
        import pandas as pd

        rows = [{"kernel": name, "lane": lane, **{k: v for k, v in r.items() if k != "fit"}, **r["fit"]}
                for lane, key in (("cold", "heldout"), ("hot", "heldout_hot"))
                for name, r in self.summary.get(key, {}).items()]
        return pd.DataFrame(rows)

    def _headline(self) -> str:
        if self.timer is None:
            return f"disk node of {self.machine}: {self.disk.get('file')}"
        return (f"{self.shapes} of {self.shapes_seen} shapes of {self.kernels} kernels timed on {self.machine} "
                f"({self.timer}) -> {self.file}")


def _typical_tile_bytes(cfg, batch: int, seq: int, tiling) -> int:
    """The typical tile (:func:`tilecast.perfmodel.disk_node.typical_tile_bytes`) of ``cfg``'s step at ``tiling``."""
    from tilecast.graph.models import build_step
    from tilecast.perfmodel.disk_node import typical_tile_bytes

    return typical_tile_bytes(build_step(cfg, batch, seq, tiling).tile_nbytes)


def _disk(machine, offload_dir, fit: bool = False, progress: bool = False, tile_bytes: int = 0,
          offload_io: str = "buffered"):
    """(DiskNode, file, probe rows): the disk node timed in ``offload_dir`` (default $TILECAST_HOME/offload), then,
    with ``fit``, the computing time the disk traffic takes from busy cores and the device's write-back rate
    (:func:`_io_cpu`), StarPU's time per tile its search for a tile to reuse walks past
    (:mod:`tilecast.loop.walk_probe`) and its other time in the workers under a limit fitted on probe steps there, on
    one worker and on two (:func:`tilecast.loop.disk_fit.calibrate_worker_costs`), and on a probe of tiles of
    ``tile_bytes`` (the calibrated configuration's typical tile) where they are much larger than the standard probes'
    (:func:`tilecast.loop.disk_fit.calibrate_tile_costs`); with ``offload_io`` ``"direct"``, the same probes run again
    with their files written with O_DIRECT, for ``DiskNode.direct_costs``; stored."""
    import os

    from tilecast.home import home
    from tilecast.perfmodel.disk_node import measure_and_store, save_disk

    if offload_dir is None:
        offload_dir = str(home("offload"))
        os.makedirs(offload_dir, exist_ok=True)
    disk, path = measure_and_store(machine, offload_dir)
    if not fit:
        return disk, path, []
    from dataclasses import replace

    from tilecast.loop.kernel_calibration import starpu_workers
    from tilecast.loop.disk_fit import tile_probe

    workers = starpu_workers(machine)
    disk, path = _io_cpu(machine, disk, offload_dir, progress)
    if not workers:
        print("tilecast calibrate: StarPU cannot run here: the disk node's StarPU costs are not fitted (the file "
              "system's figures alone are stored)", file=sys.stderr)
        return disk, path, []

    from tilecast.loop.walk_probe import measure_walk_tile_s

    if progress:
        print("disk node: StarPU's search for a tile to reuse, timed on StarPU alone", file=sys.stderr)
    walk = measure_walk_tile_s(offload_dir)  # before the probes: their simulated delays include the walks' cost
    disk = replace(disk, walk_tile_s=walk.walk_tile_s, walk_tile_source=walk.source)
    counts = sorted({1, min(workers, 2)})  # a read back costs the worker less where a core is left free
    fitted, rows = _disk_probe_costs(machine, disk, offload_dir, counts, tile_probe(tile_bytes), progress, "buffered")
    disk = replace(disk, **fitted)
    if offload_io == "direct":
        if not disk.has_device:
            print("tilecast calibrate: the device under the offload directory was not measured: the direct probes "
                  "are not run", file=sys.stderr)
        else:
            fitted_d, rows_d = _disk_probe_costs(machine, disk, offload_dir, counts, tile_probe(tile_bytes),
                                                 progress, "direct")
            disk = replace(disk, direct_costs={**fitted_d, "source": fitted_d.pop("worker_costs_source")})
            rows += [{**r, "offload_io": "direct"} for r in rows_d]
    return disk, save_disk(machine, disk), rows


def _disk_probe_costs(machine, disk, offload_dir: str, counts, probe, progress: bool, offload_io: str):
    """(fields of DiskNode: ``worker_costs``, ``worker_costs_by_workers``, ``worker_costs_source``, ``tile_costs``;
    probe rows): StarPU's costs in the workers fitted on the standard probes on each worker count of ``counts`` and
    on ``probe`` (the configuration's tile size; None: none), their files written ``offload_io``."""
    from tilecast.loop.disk_fit import PROBES, calibrate_tile_costs, calibrate_worker_costs

    by_workers, rows = {}, []
    direct = ", O_DIRECT" if offload_io == "direct" else ""
    for w in counts:
        def told(i, n, label, w=w):
            if progress:
                print(f"disk node: probe {i + 1}/{n} under a memory limit on {w} worker{'s' if w > 1 else ''}"
                      f"{direct} ({label})", file=sys.stderr)

        fitted, w_rows = calibrate_worker_costs(machine, disk, offload_dir, PROBES, w, told, offload_io)
        by_workers[str(w)] = fitted
        rows += [{**r, "workers": w} for r in w_rows]
    out = {"worker_costs": by_workers[str(counts[-1])].worker_costs,
           "worker_costs_by_workers": ({w: d.worker_costs for w, d in by_workers.items()}
                                       if len(by_workers) > 1 else {}),
           "worker_costs_source": "; ".join(d.worker_costs_source for d in by_workers.values()),
           "tile_costs": dict(disk.tile_costs) if offload_io == "buffered" else {}}
    if probe is not None:
        def told_tile(i, n, w, label):
            if progress:
                print(f"disk node: probe at the configuration's tile size {i + 1}/{n} on {w} "
                      f"worker{'s' if w > 1 else ''}{direct} ({label})", file=sys.stderr)

        per_task = {w: d.worker_costs.get("per_task", 0.0) for w, d in by_workers.items()}
        out["tile_costs"], t_rows = calibrate_tile_costs(machine, disk, offload_dir, probe, counts, told_tile,
                                                         offload_io, per_task)
        rows += t_rows
    return out, rows


def _io_cpu(machine, disk, offload_dir: str, progress: bool, busy: int | None = None, nbytes: int | None = None):
    """(DiskNode, file): ``disk`` with the computing time its traffic takes from ``busy`` threads that fill the
    cores (default: this process's cores), measured in ``offload_dir`` with blocks of ``nbytes`` (default
    :data:`~tilecast.perfmodel.io_cpu.BLOCK_BYTES`; :mod:`tilecast.perfmodel.io_cpu`), and the rate the device
    took the write block's write-back at (the forecast's flusher), stored; where either cannot be measured, the
    reason on standard error and its stored figures as they were."""
    import os
    from dataclasses import replace

    from tilecast.perfmodel.disk_node import save_disk
    from tilecast.perfmodel.io_cpu import BLOCK_BYTES, measure_io_cpu

    busy = busy or len(os.sched_getaffinity(0))
    nbytes = nbytes or BLOCK_BYTES
    kept = "; the stored figures are kept" if disk.io_cpu_busy else "; the forecast charges the workers none"
    st = os.statvfs(offload_dir)
    if 2 * nbytes > st.f_bavail * st.f_frsize // 2:
        print(f"tilecast calibrate: the computing time of disk traffic is not measured: it needs "
              f"{2 * nbytes / 2**30:.1f} GiB in {offload_dir}, which has {st.f_bavail * st.f_frsize / 2**30:.1f} "
              f"GiB free (at most half is used){kept}", file=sys.stderr)
        return disk, save_disk(machine, disk)

    what = {"write": "written and synced", "read": "read from the device", "hit": "read from the cache"}

    def told(block):
        if progress:
            print(f"disk node: computing time lost beside {busy} busy threads, {nbytes / 2**30:.1f} GiB of tiles "
                  f"{what[block]}", file=sys.stderr)

    try:
        io = measure_io_cpu(offload_dir, busy, nbytes, progress=told)
    except OSError as e:
        print(f"tilecast calibrate: the computing time of disk traffic is not measured: {e.strerror or e} in "
              f"{offload_dir}{kept}", file=sys.stderr)
        return disk, save_disk(machine, disk)
    disk = replace(disk, io_cpu_write=io.write, io_cpu_read=io.read, io_cpu_hit=io.hit, io_cpu_busy=io.busy,
                   io_cpu_source=io.source("tilecast calibrate"))
    if io.writeback:
        disk = replace(disk, device_writeback_bandwidth=io.writeback,
                       device_writeback_source=io.writeback_source("tilecast calibrate"))
    else:
        kept = (f"the stored {disk.device_writeback_bandwidth / 1e9:.3f} GB/s is kept"
                if disk.device_writeback_bandwidth else "the forecast's flusher writes at the device's O_DIRECT rate")
        print(f"tilecast calibrate: the device's write-back rate is not measured: the fsync found "
              f"{io.synced_bytes / 2**20:.0f} MiB of the {io.nbytes / 2**20:.0f} MiB written still dirty (the flusher "
              f"wrote the rest during the writes); {kept}", file=sys.stderr)
    return disk, save_disk(machine, disk)


def _timer(timer: str, workers):
    """(timer name, timer function or None for StarPU tasks) of the ``timer`` asked for."""
    from tilecast.kernels.native_build import NativeUnavailable
    from tilecast.perfmodel.timers import c_kernel_timer, numpy_reference_timer

    if timer == "starpu" and not workers:
        raise NativeUnavailable("StarPU cannot run here (see tilecast run)")
    if workers:
        return "starpu-tasks", None
    if timer == "numpy":
        return "numpy-reference", numpy_reference_timer
    fn = c_kernel_timer()
    if fn is None:
        if timer == "c":
            raise NativeUnavailable("the C kernels could not be built (see tilecast.kernels.native)")
        return "numpy-reference", numpy_reference_timer
    return "c-kernels", fn


def _probe_costs(machine, workers: int, progress: bool) -> dict:
    """The executor's costs per task and per step, measured on probe steps for every worker count and policy
    (stored for simulate and tune; :func:`tilecast.loop.host_cost.ensure_host_costs`), by worker count."""
    from tilecast.loop.candidates import worker_counts
    from tilecast.loop.host_cost import ensure_host_costs
    from tilecast.loop.tune import usable_scheds
    from tilecast.simulator.simulate import POLICIES

    fits = ensure_host_costs(machine, worker_counts(workers), progress=progress, scheds=usable_scheds(list(POLICIES)))
    out = {}
    for w, h in fits.items():
        if not isinstance(w, int):
            continue
        out[str(w)] = {"task_overhead_us": (h.task_overhead_s or 0.0) * 1e6, "host_fixed_ms": h.fixed_s * 1e3,
                       "host_per_task_us": h.per_task_s * 1e6, "host_per_tile_us": h.per_tile_s * 1e6,
                       "gap_start_buffer_us": h.gap_start_buffer_s * 1e6,
                       "gap_end_buffer_us": h.gap_end_buffer_s * 1e6, "gap_successor_us": h.gap_successor_s * 1e6,
                       "gap_ready_us": h.gap_ready_s * 1e6, "gap_handoff_us": h.gap_handoff_s * 1e6,
                       "gap_end_us_per_mib": h.gap_end_byte_s * 2**20 * 1e6, "gap_byte_cap_bytes": h.gap_byte_cap}
        tree_fit = fits.get(f"probe:{w}:prio")
        if tree_fit is not None and tree_fit.walk_step_s > 0:  # prio's tree, measured (host_cost.set_measured_tree)
            out[str(w)]["prio_tree_level_ns"] = tree_fit.push_walk_s * 1e9
        sorted_fit = fits.get(f"{w}:dmdas")
        if sorted_fit is not None and sorted_fit.walk_far_s > 0:  # dmdas's insertions (queue_costs.list_walk_s)
            out[str(w)].update(sorted_walk_ns=sorted_fit.push_walk_s * 1e9,
                               sorted_walk_far_ns=sorted_fit.walk_far_s * 1e9, sorted_walk_knee=sorted_fit.walk_knee,
                               sorted_walk_queue_ns=sorted_fit.walk_step_s * 1e9)
    return out


def calibrate(model="gpt2-tiny", batch: int = 2, seq: int = 128, tile="64", tiles=("32", "64", "128"),
              repeats: int = 7, per_kernel: int = 16, budget: float | None = None, timer: str = "auto",
              output: str | None = None, offload_dir: str | None = None, disk_only: bool = False,
              probe: bool = True, progress: bool = False, offload_io: str = "buffered") -> CalibrateResult:
    """Time the kernels over the distinct tile shapes of ``model``'s step at ``tile`` and each of ``tiles``
    (``tilecast calibrate``), as StarPU tasks on every worker where StarPU runs (``timer`` auto or starpu),
    else the C kernels (c) or numpy references (numpy) alone; ``repeats`` runs per shape; at most
    ``per_kernel`` shapes per kernel timed, fewer when the timing is estimated above ``budget`` seconds
    (default: the budget of first use), the others predicted by the shape model. The shapes are added to the
    machine's stored calibration (or written to ``output``), then probe steps measure the executor's costs
    (``probe``), and the disk node is timed in ``offload_dir`` (with ``offload_dir`` given or ``disk_only``, and
    ``probe``, the computing time the disk traffic takes from busy cores and the device's write-back rate are then
    measured there, and StarPU's time in the workers under a limit fitted on probe steps: docs/memory.md).
    ``disk_only``: the disk node alone. ``offload_io`` ``"direct"``: the disk node's probes also run with their
    files written with O_DIRECT, fitting StarPU's costs for ``--offload-io direct`` (``DiskNode.direct_costs``).
    ``progress``: a line and a bar on standard error."""
    import numpy as np
    from tqdm import tqdm

    from tilecast.graph.models import build_step
    from tilecast.loop.kernel_calibration import (BUDGET_S, HOT_PASSES, STARPU_PASSES, bounded_cases,
                                                  estimated_seconds, extrapolation_note, extrapolation_summary,
                                                  starpu_workers, time_in_starpu, timing_cost_s, with_past_cache)
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.calibration import calibrate as time_shapes
    from tilecast.perfmodel.calibration import cases_from_shapes, find_calibration
    from tilecast.perfmodel.calibration_design import choose_timed
    from tilecast.perfmodel.kernel_model import holdout_errors
    from tilecast.perfmodel.shapes import graph_shapes
    from tilecast.perfmodel.timers import default_timer

    cfg, tiling = _config(model), _tiling(tile)
    _shape(cfg, batch, seq)
    machine = load_machine("local")
    fit_disk = probe and (offload_dir is not None or disk_only)  # the disk part asked for: StarPU's costs too
    from tilecast.executor.memory_limit import OFFLOAD_IO

    if offload_io not in OFFLOAD_IO:
        raise FieldError(f"offload_io: {offload_io!r} is not one of {', '.join(OFFLOAD_IO)}")
    if offload_io == "direct" and not fit_disk:
        raise FieldError("offload_io needs offload_dir (or disk_only) and the probes")
    tile_bytes = _typical_tile_bytes(cfg, batch, seq, tiling) if fit_disk else 0
    if disk_only:
        disk, path, disk_probes = _disk(machine, offload_dir, fit_disk, progress, tile_bytes, offload_io)
        summary = {"machine": machine.name, "fingerprint": machine.fingerprint(),
                   "disk": {**asdict(disk), "file": path, "probes": disk_probes}}
        return CalibrateResult(machine.name, machine.fingerprint(), disk=summary["disk"], summary=summary,
                               disk_node=disk)
    _at_least("repeats", repeats, 1)
    _at_least("per_kernel", per_kernel, 1)
    budget = BUDGET_S if budget is None else budget
    if not budget > 0:
        raise FieldError(f"budget must be a positive number of seconds, got {budget}")
    if timer not in TIMERS:
        raise FieldError(f"timer must be one of {', '.join(TIMERS)}, got {timer!r}")
    tilings = [tiling] + [_tiling(t) for t in tiles]
    workers = starpu_workers(machine) if timer in ("auto", "starpu") else None
    stored = find_calibration(machine) if output is None else None  # what the store holds already
    timer_name, fn = _timer(timer, workers)
    shapes = []
    for t in tilings:
        shapes += graph_shapes(build_step(cfg, batch, seq, t))
    if workers:  # the step probe's shapes: its tasks are compared with their own lanes (tilecast.loop.step_probe)
        from tilecast.loop.step_probe import probe_graph

        shapes += graph_shapes(probe_graph())
    seen = cases_from_shapes(shapes)

    def costs(todo):
        est = estimated_seconds(machine, todo)
        return est, timing_cost_s(todo, est, np.full(len(todo), repeats + 1), workers or 1,
                                  STARPU_PASSES + HOT_PASSES if workers else 1)

    est, cost = costs(seen)
    over, bound = bounded_cases(machine, stored, seen, workers or 1)  # too long or too large to time
    timed, left = choose_timed(seen, cost, budget, cap=per_kernel, over=over)
    over_cases = [seen[i] for i in np.flatnonzero(over)]
    # a memory-bound kernel with shapes over the bound gets a timed shape beyond the last-level cache
    timed, seen, est, cost = with_past_cache(machine, stored, seen, over, timed, None, workers or 1, est, cost, costs)
    cases, predicted = [seen[i] for i in sorted(timed)], [seen[i] for i in sorted(set(left) - set(timed))]
    if progress:
        where = f"as StarPU tasks on {workers} busy workers" if workers else f"with the {timer_name} timer"
        print(f"timing {len(cases)} of {len(seen)} kernel shapes {where}, {repeats} runs each", file=sys.stderr)
    with tqdm(total=len(cases), unit="shape", file=sys.stderr, leave=False, disable=not progress) as bar:

        def counted(items):
            for item in items:
                yield item
                bar.update(1)

        if workers:
            cal, alone = time_in_starpu(machine, None, cases, np.full(len(cases), repeats), workers, bar)
            if alone:  # shapes StarPU cannot run (an empty buffer): timed alone
                alone_name, alone_timer = default_timer()
                cal.add_all(time_shapes(machine, alone, repeats=repeats, timer=alone_timer, timer_name=alone_name,
                                        progress=counted))
        else:
            cal = time_shapes(machine, cases, repeats=repeats, timer=fn, timer_name=timer_name, progress=counted)
    for name, row in predicted:
        cal.add_predicted(name, row)
    if workers and cal.hot:  # how much longer than their lanes a step's tasks run (tilecast.loop.step_probe)
        from tilecast.loop.step_probe import take_step_probe

        take_step_probe(machine, cal)
    if stored is not None:  # the new points beside (and, from the same source, over) the stored ones
        quiet = cal.quiet
        stored.add_all(cal)
        stored.quiet, cal = quiet, stored
    path = cal.save(output)
    probes = _probe_costs(machine, workers, progress) if workers and output is None and probe else {}
    report = holdout_errors(cal)
    extrapolated = extrapolation_summary(cal, over_cases, machine) if over_cases else {}
    if extrapolated and progress:
        print(extrapolation_note({"extrapolated": extrapolated, "bound": bound}), file=sys.stderr)
    report_hot = holdout_errors(cal, kernels=[k for k in cal.hot if cal.has_hot(k)], lane="hot") if cal.hot else {}
    disk, disk_file, disk_probes = _disk(machine, offload_dir, fit_disk, progress, tile_bytes, offload_io)
    summary = {"machine": machine.name, "fingerprint": machine.fingerprint(), "timer": timer_name, "file": path,
               "shapes": len(cases), "shapes_seen": len(seen), "shapes_predicted": len(predicted),
               "kernels": len(cal.points), "heldout": report, "heldout_hot": report_hot,
               "shapes_over_bound": int(over.sum()), "bound": bound, "extrapolated": extrapolated,
               "cache_bytes": cal.cache_bytes, "llc_bytes": cal.llc_bytes, "llc_source": cal.llc_source,
               "in_step_factor": cal.in_step_factor, "in_step_hot": cal.in_step_hot,
               "in_step_byte_s": cal.in_step_byte_s, "in_step_hot_span_s": cal.in_step_hot_span_s,
               "in_step_source": cal.in_step_source, "blas": blas_fields(),
               "quiet": cal.quiet,
               "disk": {**asdict(disk), "file": disk_file, "probes": disk_probes}, "executor_costs": probes}
    return CalibrateResult(machine.name, machine.fingerprint(), timer_name, path, len(cases), len(seen),
                           len(predicted), len(cal.points), cal.cache_bytes, summary["disk"], probes, summary, cal,
                           disk)


# --- calibrate --ranks -------------------------------------------------------------------------------------
@dataclass
class NetworkResult(_Result):
    """The network between StarPU-MPI ranks as a ping-pong measured it (``tilecast calibrate --ranks``):
    latency, StarPU-MPI's cost per message and bandwidth, stored for ``simulate_ranks`` and ``tune_ranks``;
    ``to_frame()`` has one row per message size (one-way seconds through StarPU-MPI and plain MPI, and the
    model's); ``summary`` is ``calibrate --ranks --json``; ``network`` the stored
    :class:`tilecast.perfmodel.network.Network`."""

    machine: str
    ranks: int
    workers_per_rank: int
    transport: str
    latency_s: float
    message_s: float
    bandwidth_Bps: float
    file: str
    probe: dict | None = None
    summary: dict = field(repr=False, default_factory=dict)
    network: object = field(repr=False, default=None)

    def to_frame(self):
        import pandas as pd

        net = self.network
        return pd.DataFrame([{"bytes": b, "protocol": net.protocol(b), "starpu_mpi_s": a, "mpi_s": m,
                              "model_s": float(net.seconds(b)) + net.protocol_extra_s(b)} for b, a, m in net.points])

    def _headline(self) -> str:
        return (f"network between {self.ranks} ranks: {self.latency_s * 1e6:.1f} us latency + "
                f"{self.message_s * 1e6:.1f} us per message, {self.bandwidth_Bps / 1e9:.2f} GB/s")


def calibrate_network(ranks: int = 2, workers: int = 1, sizes=None, round_trips: int = 30, probe: bool = True,
                      progress: bool = False) -> NetworkResult:
    """Measure the network between ``ranks`` StarPU-MPI ranks of ``workers`` workers (``tilecast calibrate
    --ranks``): a ping-pong of rank 0 with rank 1 over ``sizes`` bytes (default 8 B to 1 MiB), ``round_trips``
    timed per size, plain MPI then StarPU-MPI; with ``probe``, a probe step on the ranks checks the cost per
    message. Stored for the local machine. ``progress``: lines on standard error."""
    from tilecast.executor.mpi_pingpong import DEFAULT_SIZES, measure_network
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.network import save_network

    _at_least("ranks", ranks, 2)
    sizes = list(DEFAULT_SIZES if sizes is None else sizes)
    if len(set(sizes)) < 2 or not all(isinstance(s, int) and s >= 1 for s in sizes):
        raise FieldError(f"sizes: at least two distinct sizes, each a whole number of bytes >= 1, got {sizes}")
    _at_least("round_trips", round_trips, 1)
    machine = load_machine("local")
    if progress:
        print(f"ping-pong between {ranks} ranks of {workers} worker(s), {len(sizes)} sizes x {round_trips} round "
              "trips", file=sys.stderr)
    try:
        net, _ = measure_network(ranks, workers, sizes, round_trips)
    except FieldError as e:  # named by the ping-pong's own argument
        raise FieldError(str(e).replace("repeats", "round_trips", 1) if e.field == "repeats" else str(e)) from None
    found = None
    if probe:
        from tilecast.loop.ranks_probe import probe_network

        if progress:
            print("probe step on the ranks (tilecast run --ranks), 2 runs", file=sys.stderr)
        net, found = probe_network(net, ranks, workers)
    path = save_network(machine, net)
    summary = {"machine": machine.name, "ranks": net.ranks, "workers_per_rank": net.workers_per_rank,
               "transport": net.transport, "latency_s": net.latency_s, "message_s": net.message_s,
               "bandwidth_Bps": net.bandwidth_Bps, "submit_task_s": net.submit_task_s,
               "submit_cpu_task_s": net.submit_cpu_task_s, "eager_bytes": net.eager_limit(),
               "rndv_bytes": net.rendezvous_limit(), "protocol_s": net.protocol_s, "points": net.points,
               "probe": found, "file": path, "source": net.source}
    return NetworkResult(machine.name, net.ranks, net.workers_per_rank, net.transport, net.latency_s, net.message_s,
                         net.bandwidth_Bps, path, found, summary, net)


@dataclass
class SpeedCheckResult(_Result):
    """The quiet check's reference step timed now against the one the stored calibration was timed beside
    (``calibrate --check``): ``ratio`` above 1, the machine runs slower than calibrated, and steps may take about
    ``ratio`` times their forecasts from that calibration; ``within``: the difference is within ``threshold``. ``to_frame()``
    has one row per reference step timed now."""

    machine: str
    reference_calibrated_s: float
    reference_now_s: float
    ratio: float
    within: bool
    threshold: float
    workers: int
    reference_probes_s: list = field(default_factory=list)
    line: str = field(repr=False, default="")

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame({"reference_now_s": self.reference_probes_s,
                             "reference_calibrated_s": self.reference_calibrated_s})

    def _headline(self) -> str:
        return self.line


def check_speed(probes: int | None = None, threshold: float | None = None) -> SpeedCheckResult:
    """Time the quiet check's reference step ``probes`` times now (default 5, about 0.3 s each) on the workers
    calibration timed it on and compare the median with the reference step the machine's stored calibration was
    timed beside (``tilecast calibrate --check``; :mod:`tilecast.loop.speed_check`); ``within``: the two within
    ``threshold`` (default the quiet check's, 0.12). FieldError where no calibration with a reference step is
    stored, or on a bad ``probes`` or ``threshold``."""
    from tilecast.loop.kernel_calibration import starpu_workers
    from tilecast.loop.speed_check import PROBES, THRESHOLD, calibrated_reference
    from tilecast.loop.speed_check import check_speed as check
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.calibration import find_calibration

    machine = load_machine("local")
    cal = find_calibration(machine)
    calibrated_reference(cal)  # told before StarPU starts
    workers = starpu_workers(machine)
    if not workers:
        raise FieldError("calibration: StarPU does not run here, so the reference step cannot be timed")
    c = check(cal, workers, PROBES if probes is None else probes, THRESHOLD if threshold is None else threshold)
    d = c.to_dict()
    return SpeedCheckResult(machine.name, d["reference_calibrated_s"], d["reference_now_s"], d["ratio"],
                            d["within"], d["threshold"], d["workers"], d["reference_probes_s"], c.line())
