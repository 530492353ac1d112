"""The ``local`` machine: this computer, detected and measured at first use.

Cores come from the scheduler affinity, memory from ``sysconf``; the host copy
bandwidth and the one-core float32 GEMM rate are measured here (medians of a
few runs, one BLAS thread), so every figure's source is the measurement itself.
The detected description is written to ``$TILECAST_HOME/machines/local-<fingerprint>.yaml``
and reused while the hardware fingerprint (CPU model, cores, memory, the C kernels' BLAS
and its core) is unchanged.
These roofline figures are only the fallback: calibrated kernel models
(:mod:`tilecast.perfmodel.calibration`) replace them where present.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import time

import numpy as np
import yaml

from tilecast.atomic_file import atomic_write
from tilecast.home import home
from tilecast.kernels.native_build import NativeUnavailable
from tilecast.perfmodel.machine import Machine, MachineError, parse_machine


def _best_time(fn, repeats: int) -> float:
    """Fastest of ``repeats`` runs: a peak rate is what the hardware can do when nothing else runs."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.min(times))


def measure_copy_bandwidth(nbytes: int = 64 << 20, repeats: int = 5) -> float:
    """Host memory copy bandwidth in bytes copied per second (numpy ``copyto``, best of ``repeats``)."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    return nbytes / _best_time(lambda: np.copyto(dst, src), repeats)


def measure_gemm_rate(n: int = 512, repeats: int = 5) -> float:
    """float32 GEMM FLOP/s on one BLAS thread (n x n x n, best of ``repeats``)."""
    from threadpoolctl import threadpool_limits

    a = np.ones((n, n), dtype=np.float32)
    b = np.ones((n, n), dtype=np.float32)
    with threadpool_limits(1, user_api="blas"):
        return 2.0 * n**3 / _best_time(lambda: a @ b, repeats)


def measure_kernel_gemm_rate(threads: int = 1, n: int = 1024, repeats: int = 5) -> float:
    """float32 GEMM FLOP/s of the C kernels' BLAS on ``threads`` threads, one BLAS thread each.

    This is how StarPU's workers run it (one single-threaded GEMM per worker at a
    time), so it is the peak that an executed step's GFLOP/s is set against. Each
    thread times ``repeats`` n x n x n GEMMs at once with the others; the rate is
    the sum over threads of their fastest run.
    """
    import threading

    from tilecast.kernels import native

    native.library()
    rng = np.random.default_rng(0)
    bufs = [[rng.standard_normal(n * n, dtype=np.float32) for _ in range(3)] for _ in range(threads)]
    best = [0.0] * threads
    params = [0, 0, n, n, n, 1.0, 0.0]

    def run(i):  # cffi releases the GIL during the C call: the threads run in parallel
        best[i] = float(np.min(native.time_kernel("gemm", params, bufs[i], repeats=repeats)))

    pool = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(2.0 * n**3 / b for b in best)


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:  # pragma: no cover
        pass
    return platform.processor() or "unknown"


def kernels_blas() -> str:
    """The C kernels' BLAS and the core it runs here: a change of either makes kernel timings stale."""
    from tilecast.kernels.blas import blas_info

    try:
        info = blas_info()
    except NativeUnavailable:
        return "unavailable"
    return f"{info.library} {info.version} {info.core}"


def hardware() -> dict:
    """What kernel speeds depend on; part of the local machine's fingerprint (its calibrations' key)."""
    return {"cpu": cpu_model(), "cores": cpu_count(), "memory_bytes": memory_bytes(), "machine": platform.machine(),
            "blas": kernels_blas()}


@functools.lru_cache(maxsize=1)
def detect_local() -> Machine:
    """Describe this computer: one CPU worker per core on one host memory node (cached on disk)."""
    hw = hardware()
    key = hashlib.sha256(json.dumps(hw, sort_keys=True).encode()).hexdigest()[:16]
    path = str(home("machines", f"local-{key}.yaml"))
    if os.path.exists(path):
        try:
            with open(path) as f:
                m = parse_machine(yaml.safe_load(f), where=path)
            m.meta["hardware"] = hw
            return m
        except (MachineError, yaml.YAMLError, OSError):
            pass  # re-detect below
    m = _detect(hw)
    with atomic_write(path, "w") as f:
        yaml.safe_dump(m.meta.pop("doc"), f, sort_keys=False)
    return m


def _detect(hw: dict) -> Machine:
    from tilecast.perfmodel.cache_size import l2_per_core

    cores, mem = hw["cores"], hw["memory_bytes"]
    l2, l2_source = l2_per_core()
    copy_bw = measure_copy_bandwidth()
    try:  # the rate of the BLAS that the C kernels (so StarPU's tasks) call; numpy's where they cannot build
        gemm, gemm_source = measure_kernel_gemm_rate(1, n=512), "the C kernels' BLAS"
    except NativeUnavailable:
        gemm, gemm_source = measure_gemm_rate(), "numpy's BLAS (the C kernels cannot be built here)"
    doc = {
        "format": 1,
        "name": "local",
        "description": f"this computer: {cores} cores of {hw['cpu']}",
        "runtime": {"task_overhead_us": {"value": 3.0, "source": "StarPU 1.3.10 measured on 2-core VMs: 2-4 us "
                                                                  "per task (benchmarks/starpu_overhead.py)"}},
        "memory_nodes": [{"name": "host", "kind": "ram",
                          "capacity_GiB": {"value": mem / 2**30, "source": "detected: sysconf(SC_PHYS_PAGES)"}}],
        "worker_kinds": {"cpu": {
            "peak_tflops": {"value": gemm / 1e12, "source": f"measured: 512^3 float32 GEMM of {gemm_source}, one "
                                                                  "BLAS thread, best of 5"},
            "memory_bandwidth_GBps": {"value": 2 * copy_bw / 1e9,
                                      "source": "measured: 64 MiB numpy copy, bytes read + written, best of 5"},
            "compute_efficiency": {"value": 1.0, "source": "the peak above is already a measured rate"},
            "memory_efficiency": {"value": 1.0, "source": "the bandwidth above is already a measured rate"},
            "half_efficiency_gflop": {"value": 0.002, "source": "assumed: BLAS reaches half its rate near 64^3 GEMMs"},
            "launch_us": {"value": 1.0, "source": "assumed: a C function call with argument unpacking"},
            "l2_per_core_KiB": {"value": l2 / 1024, "source": l2_source},
        }},
        "workers": [{"name": "cpu", "kind": "cpu", "count": cores, "units": 1, "memory_node": "host"}],
    }
    m = parse_machine(doc, where="local")
    m.meta["hardware"] = hw
    m.meta["doc"] = doc
    return m


def run_conditions() -> dict:
    """The CPU and both BLAS libraries in use, for a benchmark's or report's figures.

    ``kernels_blas`` is what the C kernels (and so StarPU's tasks) run; ``numpy_blas``
    is numpy's own OpenBLAS (as threadpoolctl reports it), which numpy-side
    references such as a full-matrix SGEMM rate use. A fallback core is warned
    about on standard error.
    """
    import sys

    from threadpoolctl import threadpool_info

    from tilecast.kernels.blas import blas_info

    try:
        info = blas_info()
        kernels, fallback = f"{info.describe()} [{info.core_isa}]", info.fallback
        if info.warning():
            print(info.warning(), file=sys.stderr)
    except NativeUnavailable as e:
        kernels, fallback = f"unavailable ({e})", None
    numpy_blas = "; ".join(f"{i.get('internal_api')} {i.get('version')} core {i.get('architecture')}"
                           for i in threadpool_info()
                           if i.get("user_api") == "blas" and "scipy_openblas32" not in str(i.get("filepath"))
                           ) or "none loaded"
    return {"cpu": cpu_model(), "cores": cpu_count(), "kernels_blas": kernels, "kernels_blas_fallback": fallback,
            "numpy_blas": numpy_blas}


def conditions_line(c: dict) -> str:
    """:func:`run_conditions` in one line for people."""
    return (f"CPU {c['cpu']} ({c['cores']} cores); C kernels' BLAS {c['kernels_blas']}; "
            f"numpy's BLAS {c['numpy_blas']}")
