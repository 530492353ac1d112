"""Where StarPU's time per disk transfer goes: a glibc AIO request waiting for a core held by spinning workers.

StarPU 1.3.10's unistd disk backend (the one ``--offload-dir`` registers) issues every transfer with
glibc's POSIX AIO, which runs the ``pwrite``/``pread`` in a helper thread of the C library; StarPU finds
the completion by polling ``aio_error`` from its CPU workers, which (Debian's build,
``STARPU_NON_BLOCKING_DRIVERS``) spin on their cores and never sleep. With as many workers as cores the
helper thread has no free core (docs/memory.md, "Where StarPU's time per disk transfer goes").

This benchmark reproduces that without StarPU (:mod:`tilecast.perfmodel.aio_wait`): one thread pinned to
CPU 0 issues an ``aio_write`` then an ``aio_read`` of one tile-sized file and spins on ``aio_error`` until
each completes, while ``WORKERS - 1`` more threads spin on the other cores (``WORKERS`` 0: the issuing
thread blocks in ``aio_suspend``). It prints the per-transfer time (median, mean, 90th percentile,
microseconds) for each worker count, and a plain ``pwrite``/``pread`` of the same files. Last line: one
JSON object (``rows``: ``workers``, and per operation ``median_us``, ``mean_us``, ``p90_us``).

    python3 benchmarks/disk_wakeup.py                     # workers 0, 1, ..., cores; 16 KiB tiles
    python3 benchmarks/disk_wakeup.py --bytes 262144 --transfers 300
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tilecast.home import home  # noqa: E402
from tilecast.perfmodel.aio_wait import OPS, cores, measure_aio_wait  # noqa: E402


def main(argv=None) -> int:
    n_cores = cores()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default=",".join(str(w) for w in range(n_cores + 1)), metavar="LIST",
                   help="spinning worker counts to time (default: 0 to the number of cores)")
    p.add_argument("--transfers", type=int, default=1000, metavar="N", help="transfers each way (default: 1000)")
    p.add_argument("--bytes", type=int, default=16 << 10, metavar="N", help="bytes per transfer (default: 16 KiB)")
    p.add_argument("--dir", default=None, metavar="DIR",
                   help="directory of the files (default: $TILECAST_HOME/offload, as the disk node's)")
    args = p.parse_args(argv)
    directory = args.dir or str(home("offload"))
    os.makedirs(directory, exist_ok=True)
    rows = []
    print(f"{n_cores} cores, {args.bytes} bytes per transfer, {args.transfers} transfers each way, in {directory}; "
          f"load average before: {os.getloadavg()[0]:.2f}")
    print(f"{'workers':>8}" + "".join(f"{op + ' us med/mean/p90':>30}" for op in OPS))
    with tempfile.TemporaryDirectory(prefix=".tilecast-aio-", dir=directory) as work:
        for w in (int(x) for x in args.workers.split(",")):
            t = measure_aio_wait(work, w, args.transfers, args.bytes)
            row = {"workers": w}
            for op in OPS:
                us = t[op] * 1e6
                row[op] = {"median_us": float(np.median(us)), "mean_us": float(us.mean()),
                           "p90_us": float(np.percentile(us, 90))}
            rows.append(row)
            print(f"{w:>8}" + "".join(f"{row[op]['median_us']:>12.1f}{row[op]['mean_us']:>9.1f}{row[op]['p90_us']:>9.1f}"
                                      for op in OPS))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(json.dumps({"rows": rows, "bytes": args.bytes, "transfers": args.transfers, "cores": n_cores,
                      "load_average": os.getloadavg()[0]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
