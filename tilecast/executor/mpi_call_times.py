"""The MPI calls of a ``run --ranks``, timed: build the interposer ``c/mpi_call_times.c``, load it into the ranks,
read what they wrote.

Debian's StarPU 1.3.10 has no FxT, so nothing in StarPU says when StarPU-MPI's progress thread posted, tested or
completed a request. The interposer (MPI's profiling interface: each ``MPI_Isend``, ``MPI_Irecv``, ``MPI_Test``,
... calls its ``PMPI_`` twin) records every such call's start and length on ``CLOCK_MONOTONIC``, its thread,
bytes and request handle. :func:`tilecast.executor.mpi_launch.run_mpi` with ``mpi_calls=True`` preloads it
into the ranks (``LD_PRELOAD``) and returns each rank's calls on the clock of its trace
(``MPIRunResult.mpi_calls``, and what recording one call cost each rank, ``MPIRunResult.mpi_call_cost_s``,
timed by the interposer: two clock reads and a record, 0.05-0.2 us on a virtual machine, which a step of some
hundred thousand calls feels; a run measured this way is for what its calls say, not for its step time).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from tilecast.executor.starpu_native import C_DIR
from tilecast.home import home
from tilecast.kernels.native_build import NativeUnavailable, build_key

SOURCE = C_DIR / "mpi_call_times.c"
#: one record of ``c/mpi_call_times.c`` (``tc_call``)
CALL = np.dtype([("t_us", "<f8"), ("dur_us", "<f4"), ("tid", "<i4"), ("bytes", "<i4"), ("op", "<i2"),
                 ("flag", "<i2"), ("request", "<i8"), ("peer", "<i4"), ("tag", "<i4")])
ISEND, ISSEND, IRECV, TEST, IPROBE, WAIT, BARRIER = 1, 2, 3, 4, 5, 6, 7
FILE = "calls-{}.bin"
ENV_DIR = "TILECAST_MPI_CALLS_DIR"


def library() -> Path:
    """The interposer's shared library, built with ``mpicc`` on first use (cached under ``$TILECAST_HOME``);
    :class:`NativeUnavailable` without an Open MPI compiler."""
    from tilecast.executor.mpi_native import MPI_HINT

    mpicc = shutil.which("mpicc")
    if not mpicc:
        raise NativeUnavailable(f"timing MPI calls needs mpicc (install: {MPI_HINT})")
    root = home("native")
    target = root / f"mpi_call_times-{build_key([SOURCE.read_bytes(), mpicc])}" / "libtilecast_mpi_calls.so"
    if target.exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="mpi_call_times-", dir=root))
    try:
        res = subprocess.run([mpicc, "-O2", "-shared", "-fPIC", "-o", str(tmp / target.name), str(SOURCE)],
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise NativeUnavailable(f"building the MPI call timer failed: {(res.stderr or res.stdout).strip()[-300:]}")
        target.parent.mkdir(exist_ok=True)
        os.replace(tmp / target.name, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def launch_env(run_dir: Path) -> dict:
    """What the ranks' environment needs for their calls to be timed into ``run_dir``."""
    pre = os.environ.get("LD_PRELOAD", "")
    return {"LD_PRELOAD": f"{library()}{':' + pre if pre else ''}", ENV_DIR: str(run_dir)}


def read_calls(path: Path) -> tuple[np.ndarray, float]:
    """The records one rank wrote, oldest first, and what recording one call cost it (seconds)."""
    raw = Path(path).read_bytes()
    n = int(np.frombuffer(raw[:8], "<i8")[0])
    cost_us = float(np.frombuffer(raw[8:16], "<f8")[0])
    return np.frombuffer(raw[16:16 + n * CALL.itemsize], CALL), cost_us * 1e-6


def on_trace_clock(calls: np.ndarray, origin_us: float) -> np.ndarray:
    """Calls with ``t_s``: seconds from ``origin_us`` (the rank's trace origin on ``CLOCK_MONOTONIC``), sorted by
    it."""
    order = np.argsort(calls["t_us"], kind="stable")
    calls = calls[order]
    out = np.empty(len(calls), CALL.descr + [("t_s", "<f8")])
    for name in CALL.names:
        out[name] = calls[name]
    out["t_s"] = (calls["t_us"] - origin_us) * 1e-6
    return out


def request_kinds(calls: np.ndarray) -> np.ndarray:
    """Per call: for an ``MPI_Test``/``MPI_Wait``, what its request was (``ISEND`` or ``IRECV``, from the call that
    returned that handle last before it; 0 when none did); 0 for other calls. Handles are reused once a request
    completes, so each test takes the latest post of its handle: calls grouped by handle in call order, each
    post's kind carried forward within its group."""
    op = np.asarray(calls["op"])
    n = len(op)
    post = np.where(np.isin(op, (ISEND, ISSEND)), ISEND, np.where(op == IRECV, IRECV, 0)).astype(np.int8)
    order = np.lexsort((np.arange(n), np.asarray(calls["request"])))  # by handle, then call order
    req = np.asarray(calls["request"])[order]
    pos = np.arange(n)
    group_start = np.maximum.accumulate(np.where(np.r_[True, req[1:] != req[:-1]], pos, 0))
    last_post = np.maximum.accumulate(np.where(post[order] != 0, pos, -1))
    carried = np.where(last_post >= group_start, post[order][np.maximum(last_post, 0)], 0)
    kind = np.zeros(n, np.int8)
    kind[order] = carried
    return np.where(np.isin(op, (TEST, WAIT)), kind, 0).astype(np.int8)
