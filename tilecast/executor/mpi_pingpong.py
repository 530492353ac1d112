"""What a message between ranks costs: a ping-pong of rank 0 with rank 1, under ``mpirun``.

:func:`measure_network` starts N ranks (``python -m tilecast.executor.mpi_pingpong SPEC.json``) as
``tilecast run --ranks N`` starts them (same binding, same StarPU configuration, ``workers`` CPU workers
per rank). Each rank first runs a ping-pong of plain ``MPI_Send``/``MPI_Recv`` (MPI's own latency), then
starts StarPU-MPI and runs the same ping-pong with ``starpu_mpi_send``/``starpu_mpi_recv`` of a registered
tile while its workers run (what StarPU-MPI adds per message, and the bandwidth it gets). One-way time =
round trip / 2 (lower quartile per size); fitted by :func:`tilecast.perfmodel.network.fit_network`.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from tilecast.executor.mpi_launch import DEFAULT_TIMEOUT_S, _launch, mpirun_command
from tilecast.atomic_file import atomic_write
from tilecast.home import home
from tilecast.errors import FieldError

RESULT = "pingpong.npz"
# on both sides of Open MPI's shared-memory limits (eager up to 4 KB, a rendezvous' first fragment up to 32 KB,
# headers included; ompi_limits): 3 eager sizes, 3 that one fragment carries, 4 that need a second
DEFAULT_SIZES = (8, 1024, 4000, 4200, 16384, 32000, 33000, 65536, 262144, 1048576)


def ompi_limits() -> dict:
    """Open MPI's shared-memory limits as ``run --ranks`` starts it (``ompi_info --param btl vader --level 9
    --parsable``, with the launcher's ``OMPI_MCA_*`` settings): ``eager_bytes`` (the payload a send carries
    in one fragment and completes as it leaves) and ``rndv_bytes`` (what a rendezvous' first fragment
    carries), each less ob1's header (:mod:`tilecast.perfmodel.network`); {} when ``ompi_info`` is missing
    or says neither."""
    from tilecast.perfmodel.network import OB1_HEADER, OB1_RNDV_HEADER

    exe = shutil.which("ompi_info")
    if not exe:
        return {}
    env = dict(os.environ)
    env.setdefault("OMPI_MCA_btl_vader_single_copy_mechanism", "none")  # as _launch sets it
    try:
        out = subprocess.run([exe, "--param", "btl", "vader", "--level", "9", "--parsable"], capture_output=True,
                             text=True, timeout=60, env=env).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    got = {}
    for line in out.splitlines():
        parts = line.split(":")
        if len(parts) >= 7 and parts[5] == "value" and parts[4] in ("btl_vader_eager_limit",
                                                                     "btl_vader_rndv_eager_limit"):
            try:
                got[parts[4]] = int(parts[6])
            except ValueError:
                pass
    limits = {}
    if "btl_vader_eager_limit" in got:
        limits["eager_bytes"] = got["btl_vader_eager_limit"] - OB1_HEADER
    if "btl_vader_rndv_eager_limit" in got:
        limits["rndv_bytes"] = got["btl_vader_rndv_eager_limit"] - OB1_RNDV_HEADER
    return limits


def transport() -> str:
    """The MPI and how ranks meet: ``Open MPI <version>, one host (shared memory)``."""
    version = "MPI"
    mpirun = shutil.which("mpirun")
    if mpirun:
        try:
            out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
            first = out.splitlines()[0] if out else ""
            version = first.replace("mpirun (Open MPI)", "Open MPI").strip() or version
        except (OSError, subprocess.SubprocessError):
            pass
    return f"{version}, one host ({platform.node()}, shared memory)"


def run_pingpong_rank(spec: dict) -> None:
    from tilecast.executor.mpi_native import mpi_glue
    from tilecast.executor.mpi_rank import set_binding
    from tilecast.executor.starpu_session import starpu_home

    sz = starpu_home()
    sz.mkdir(parents=True, exist_ok=True)
    os.environ["STARPU_HOME"] = str(sz)
    os.environ.setdefault("STARPU_SILENT", "1")
    set_binding(spec["workers"], spec["ranks"])
    g = mpi_glue()
    lib, ffi = g.lib, g.ffi
    sizes = np.ascontiguousarray(spec["sizes"], dtype=np.int64)
    reps = int(spec["repeats"])
    raw = np.zeros(len(sizes) * reps)
    ret = lib.tcsm_pingpong(1, len(sizes), ffi.from_buffer("int64_t[]", sizes), reps, ffi.from_buffer("double[]", raw))
    if ret != 0:
        raise RuntimeError(f"the MPI ping-pong failed: error {ret}")
    ret = lib.tcsm_start(spec["sched"].encode(), spec["workers"])
    if ret != 0:
        raise RuntimeError(f"StarPU-MPI failed to start: {ret}")
    via = np.zeros(len(sizes) * reps)
    ret = lib.tcsm_pingpong(0, len(sizes), ffi.from_buffer("int64_t[]", sizes), reps, ffi.from_buffer("double[]", via))
    if ret != 0:
        raise RuntimeError(f"the StarPU-MPI ping-pong failed: error {ret}")
    if lib.tcsm_rank() == 0:
        path = Path(spec["run_dir"]) / RESULT
        with atomic_write(path) as f:
            np.savez(f, sizes=sizes, mpi_rtt_s=raw.reshape(len(sizes), reps), starpu_rtt_s=via.reshape(len(sizes), reps))
    lib.tcsm_barrier()
    lib.tcsm_stop()


def measure_network(ranks: int = 2, workers: int = 1, sizes=DEFAULT_SIZES, repeats: int = 30, sched: str = "lws",
                    timeout_s: float = DEFAULT_TIMEOUT_S):
    """Ping-pong on ``ranks`` ranks of ``workers`` workers; returns the fitted
    :class:`~tilecast.perfmodel.network.Network` (its ``points``: medians per size) and the raw
    round trips {sizes, mpi_rtt_s, starpu_rtt_s}. FieldError on bad input, MPIRunError on a failed run."""
    from tilecast.executor.mpi_native import mpi_glue
    from tilecast.executor.starpu_session import max_workers
    from tilecast.perfmodel.network import fit_network

    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
        raise FieldError(f"ranks: a ping-pong needs at least 2 ranks, got {ranks!r}")
    if not 1 <= workers <= max_workers():
        raise FieldError(f"workers must be between 1 and {max_workers()}, got {workers}")
    if repeats < 1:
        raise FieldError(f"repeats must be at least 1, got {repeats}")
    sizes = sorted({int(s) for s in sizes})
    if len(sizes) < 2 or sizes[0] < 1:
        raise FieldError("sizes: at least two message sizes, each at least 1 byte")
    mpirun_command(ranks)
    mpi_glue()
    root = home("mpi-runs")
    root.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix="pingpong-", dir=root))
    try:
        # every size twice, the first pass untimed: the first sizes timed after the ranks start ran 10-100x
        # slower than the same sizes later (96 us against 12 us through StarPU-MPI, 4 ms against 1.4 us with
        # plain MPI, at load 8), whatever the size
        spec = dict(ranks=ranks, workers=workers, sizes=sizes + sizes, repeats=repeats, sched=sched, run_dir=str(run_dir),
                    timeout_s=timeout_s)
        spec_path = run_dir / "spec.json"
        spec_path.write_text(json.dumps(spec))
        _launch(spec_path, ranks, timeout_s, module="tilecast.executor.mpi_pingpong")
        with np.load(run_dir / RESULT) as f:
            got = {k: f[k][len(sizes):].copy() for k in f.files}
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    # the lower quartile of the round trips: on a shared machine the slow ones are other work's time slices
    one_way_mpi = np.percentile(got["mpi_rtt_s"], 25, axis=1) / 2
    one_way_starpu = np.percentile(got["starpu_rtt_s"], 25, axis=1) / 2
    src = (f"ping-pong of rank 0 with rank 1, {ranks} ranks of {workers} worker(s) ({sched}), {repeats} round trips "
           f"per size, lower-quartile one-way times")
    net = fit_network(got["sizes"], one_way_starpu, one_way_mpi, source=src, transport=transport(), ranks=ranks,
                      workers_per_rank=workers, **ompi_limits())
    return net, got


def main(argv=None) -> int:
    import faulthandler

    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    faulthandler.dump_traceback_later(spec["timeout_s"] + 20, exit=True)
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "?"))
    try:
        run_pingpong_rank(spec)
    except Exception as e:
        print(f"tilecast rank {rank}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

