"""The time of a disk transfer as StarPU's unistd disk backend issues it (glibc's POSIX AIO), among spinning
workers: a probe of one suspected cost of StarPU's disk transfers.

StarPU 1.3.10's unistd disk backend issues every transfer with glibc's POSIX
AIO (``starpu_unistd_global_async_write``/``_read`` call ``aio_write``/
``aio_read``): glibc runs the ``pwrite``/``pread`` in a helper thread of its
own, woken for each request, and StarPU's CPU workers find the completion by
polling ``aio_error`` (``starpu_unistd_global_test_request``) in their progress
loop. Debian's StarPU is built with ``STARPU_NON_BLOCKING_DRIVERS``: its workers
never sleep, so the helper thread may have to wait for a core.

:func:`measure_aio_wait` times that path (``c/aio_wait.c``, built like the
other native code into ``$TILECAST_HOME/native``): one tile-sized
``aio_write`` then ``aio_read`` at a time, with ``workers`` threads spinning
pinned to cores, the issuing one among them. On the 2-core machine of
docs/memory.md a 16 KiB transfer takes about 5 us with every core spinning as
without: the helper thread is not kept waiting, and this is not where StarPU's
time per disk transfer goes (docs/memory.md, "Where StarPU's time per disk
transfer goes").
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from tilecast.kernels.native_build import build_extension

C_DIR = Path(__file__).parent / "c"
NAME = "_tilecast_aio_wait"
OPS = ("aio_write", "aio_read", "pwrite", "pread")


def _lib():
    decl = "int tc_aio_wait(int workers, int n, int64_t bytes, const char *dir, double *t);"
    return build_extension(NAME, decl, "#include <stdint.h>\n" + decl,
                           sources=[C_DIR / "aio_wait.c"], extra_compile_args=["-O2", "-std=gnu11"],
                           libraries=["pthread"], hint="apt-get install build-essential")


def measure_aio_wait(directory: str, workers: int, transfers: int = 300, nbytes: int = 16 << 10) -> dict:
    """Seconds per transfer, {operation: array of ``transfers`` values} for ``aio_write``, ``aio_read`` (the
    issuing thread spinning on ``aio_error`` among ``workers`` spinning threads; 0: blocking in
    ``aio_suspend``) and a plain ``pwrite``, ``pread`` of the same files, in ``directory``."""
    if workers < 0 or transfers < 1 or nbytes < 1:
        raise ValueError(f"workers, transfers, nbytes: {workers}, {transfers}, {nbytes} out of range")
    m = _lib()
    t = np.zeros(4 * transfers)
    err = m.lib.tc_aio_wait(int(workers), int(transfers), int(nbytes), os.fsencode(directory),
                            m.ffi.from_buffer("double[]", t))
    if err:
        raise OSError(err, f"aio_wait in {directory}: {os.strerror(err)}")
    return dict(zip(OPS, t.reshape(4, transfers)))


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0))
