"""The offload device with reads and write-back at once: what a write stream past Linux's dirty threshold runs at,
and what a read from the device waits while the page cache writes back.

A memory-limited step (docs/memory.md) writes tiles back through the page cache while its workers read others
from the device. This times, in ``--dir``, StarPU's unistd transfers (one file per 256 KiB tile, made once and
rewritten, one ``pwrite`` or ``pread`` of the whole tile), each side in its own process:

1. ``direct_read``, ``direct_write``: ``O_DIRECT`` reads of a pool of tiles, then rewrites of another pool, each
   alone for ``--seconds``: the device at one request at a time, as ``calibrate`` times it;
2. ``cold_read``: buffered reads of tiles not in the page cache (each dropped again after its read,
   ``posix_fadvise(DONTNEED)``), alone: the read a worker waits for when its tile missed the cache;
3. ``write_stream``: :func:`tilecast.perfmodel.writeback_pace.measure_writeback`, for up to ``3 x --seconds``:
   buffered rewrites of a pool of tiles (each once, the pool sized from the dirty thresholds) as fast as they go,
   alone: at the page cache's speed until the dirty bytes reach the threshold, then at what holds them there; the
   paced rate, the rate over the last third, and ``/proc/meminfo``'s Dirty + Writeback, sampled;
4. ``cold_read_with_writes``: phase 2 beside a writer rewriting a pool of ``--pool-gib`` at ``--write-gbps``
   (the flusher writing back once the dirty bytes pass ``dirty_background_ratio``): the reads' time, and the
   writer's.

Every file is removed at the end. On the AMD EPYC guest the write stream's pace is the hypervisor's first touch of
the page cache's new pages, not the flusher's (:mod:`tilecast.perfmodel.writeback_pace`): the forecast's flusher
writes at the rate ``tilecast calibrate --offload-dir`` measures (:mod:`tilecast.perfmodel.io_cpu`). Last line: one
JSON object.

    python3 benchmarks/disk_contention.py --dir /scratch/tc
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time

from tilecast.perfmodel.writeback_pace import (TILE, make_pool, measure_writeback, meminfo, shuffled_offsets, stats,
                                               tile_buffer, write_tiles)


def _reader(path, n, direct: bool, seconds: float, q) -> None:
    """Reads the tiles in turn (shuffled) for ``seconds``; puts (start, seconds) of each read."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    offsets = shuffled_offsets(n, 1)
    buf = tile_buffer()
    out, i = [], 0
    end = time.perf_counter() + seconds
    while True:
        t = time.perf_counter()
        if t > end:
            break
        off = offsets[i % n]
        os.preadv(fd, [buf], off)
        out.append((t, time.perf_counter() - t))
        if not direct:
            os.posix_fadvise(fd, off, TILE, os.POSIX_FADV_DONTNEED)  # cold again for its next read
        i += 1
    q.put(("read", out))


def _writer(path, n, direct: bool, rate: float, seconds: float, q) -> None:
    """:func:`~tilecast.perfmodel.writeback_pace.write_tiles` in a process: puts (start, seconds) of each
    ``pwrite``."""
    q.put(("write", write_tiles(path, n, direct, rate, seconds)))


def _phase(jobs, seconds: float) -> tuple[dict, list]:
    """Run ``jobs`` ((function, args)) in processes for ``seconds``; their records ("read", "write"), and
    /proc/meminfo sampled."""
    q = mp.Queue()
    procs = [mp.Process(target=f, args=(*a, seconds, q)) for f, a in jobs]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    samples = []
    while any(p.is_alive() for p in procs) and len(samples) < 4 * seconds + 40:
        time.sleep(0.25)
        samples.append({"t": round(time.perf_counter() - t0, 2), **meminfo()})
        if q.qsize() == len(procs):
            break
    results = dict(q.get() for _ in procs)
    for p in procs:
        p.join()
    return results, samples


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--read-mib", type=int, default=512, help="the pool of tiles read, MiB")
    ap.add_argument("--pool-gib", type=float, default=10.0,
                    help="the pool of tiles the writer beside the cold reads rewrites (each once), GiB")
    ap.add_argument("--write-gbps", type=float, default=0.5, help="the writer's pace beside the cold reads, GB/s")
    ap.add_argument("--seconds", type=float, default=6.0, help="each phase (the write stream: 3 times this)")
    args = ap.parse_args()
    if not os.path.isdir(args.dir):
        print(f"disk_contention: --dir: no such directory {args.dir}", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix=".tilecast-contention-", dir=args.dir)
    vm = {k: open(f"/proc/sys/vm/{k}").read().strip() for k in
          ("dirty_ratio", "dirty_background_ratio", "dirty_bytes", "dirty_background_bytes")}
    out = {"tile_bytes": TILE, "load_before": os.getloadavg(), "vm": vm, "meminfo_before": meminfo()}
    s = args.seconds
    try:
        nr, nw = (args.read_mib << 20) // TILE, int(args.pool_gib * 2**30) // TILE
        reads = (make_pool(os.path.join(work, "r"), nr), nr)
        writes = (make_pool(os.path.join(work, "w"), nw), nw)
        os.sync()
        out["direct_read"] = stats(_phase([(_reader, (*reads, True))], s)[0]["read"])
        out["direct_write"] = stats(_phase([(_writer, (*writes, True, 0.0))], s)[0]["write"])
        out["cold_read"] = stats(_phase([(_reader, (*reads, False))], s)[0]["read"])
        for k in ("direct_read", "direct_write", "cold_read"):
            print(f"{k}: {json.dumps(out[k])}", flush=True)
        pace = measure_writeback(args.dir, 3 * s)  # its own pool, removed before it returns
        t = [x[0] for x in pace.samples]
        last = [x for x in pace.samples if x[0] >= 2 * t[-1] / 3] if t else []
        out["write_stream"] = {**pace.to_dict(), "gbps": pace.bandwidth / 1e9, "last_third_gbps": (
            (last[-1][1] - last[0][1]) / (last[-1][0] - last[0][0]) / 1e9 if len(last) > 1 else 0.0),
            "dirty_mib": [(round(x[0], 2), x[2] >> 20) for x in pace.samples[::5]]}
        print(f"write_stream: {json.dumps(out['write_stream'])}", flush=True)
        t0 = time.perf_counter()
        os.sync()
        out["sync_after_stream_s"] = time.perf_counter() - t0
        res, samples = _phase([(_reader, (*reads, False)), (_writer, (*writes, False, args.write_gbps * 1e9))],
                              3 * s)
        r, w = res["read"], res["write"]
        t0 = min(r[0][0], w[0][0])
        out["cold_read_with_writes"] = {"read_last_two_thirds": stats(r, t0 + s), "write_last_third": stats(w, t0 + 2 * s),
                                        "dirty_max": max(x["Dirty"] for x in samples),
                                        "dirty_mib": [(x["t"], x["Dirty"] >> 20) for x in samples]}
        print(f"cold_read_with_writes: {json.dumps(out['cold_read_with_writes'])}", flush=True)
        t0 = time.perf_counter()
        os.sync()
        out["sync_after_mixed_s"] = time.perf_counter() - t0
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["load_after"] = os.getloadavg()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
