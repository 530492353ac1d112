"""The memory-limited forecast with and without the page cache in front of the device, from one set of probe runs.

``fit``: times the disk node in ``--offload-dir`` as ``tilecast calibrate --disk-only`` does (the page
cache's speed, and the device's with O_DIRECT), runs calibrate's probe steps on StarPU once, and fits StarPU's
time in the workers on them twice: per tile and per byte (the fit before the page cache model:
``loop.disk_fit.EVENTS``) and per tile only (``PROBE_EVENTS``). It writes two disk nodes to ``--out``:
``before.disk.json`` (per-byte fit, no device figures: every transfer at the cache's speed, as forecasts were)
and ``after.disk.json`` (per-tile fit, the device under the page cache), and stores the second as the local
machine's, for ``simulate``, ``out_of_core.py`` and ``memory_forecast.py``.

``forecast``: the forecast of each ``--configs`` entry (``TILE:LIMIT``) of ``--model`` with each ``--disk``
file; ``--measured`` (the JSON line of ``benchmarks/memory_forecast.py``) puts the measured steps beside them.
``--cache-gib`` and ``--device-gbps WRITE,READ`` replace this machine's page cache and the device's bandwidth
(to forecast a run measured on another machine).

Last line: one JSON object (``probes`` or ``rows``, the conditions).

    python3 benchmarks/page_cache_forecast.py fit --offload-dir /scratch/tc --out /scratch/fits
    python3 benchmarks/page_cache_forecast.py forecast --disk /scratch/fits/before.disk.json \\
        --disk /scratch/fits/after.disk.json --model gpt2-tiny --batch 4 --seq 128 --configs 32:4MiB,64:6MiB
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, replace


def fit(args) -> int:
    from tilecast.loop.disk_fit import EVENTS, PROBE_EVENTS, PROBES, fit_probe_costs, run_probe
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.disk_node import measure_disk, save_disk
    from tilecast.perfmodel.local import run_conditions

    machine = load_machine("local")
    conditions = run_conditions()
    disk = measure_disk(args.offload_dir)
    print(f"disk node: {disk.describe()}\n  ({disk.source}; {disk.device_source})", flush=True)
    base = replace(disk, runtime_latency=0.0, runtime_source="", worker_costs={}, worker_costs_source="",
                   worker_costs_by_workers={})
    t0 = time.perf_counter()
    runs = [run_probe(machine, base, args.offload_dir, p, args.workers) for p in PROBES]
    print(f"probes run in {time.perf_counter() - t0:.0f} s", flush=True)
    os.makedirs(args.out, exist_ok=True)
    out = {}
    for name, keys, node in (("before", EVENTS, replace(base, device_write_bandwidth=0.0, device_read_bandwidth=0.0,
                                                         device_read_latency=0.0, device_source="")),
                             ("after", PROBE_EVENTS, base)):
        costs, rows = fit_probe_costs(machine, node, runs, keys)
        fitted = replace(node, worker_costs=costs, worker_costs_source=(
            f"fitted by benchmarks/page_cache_forecast.py on calibrate's probes ({', '.join(keys)})"))
        path = os.path.join(args.out, f"{name}.disk.json")
        with open(path, "w") as f:
            json.dump({"format": 1, **asdict(fitted)}, f, indent=1)
        print(f"\n{name}: {fitted.describe()} -> {path}")
        for r in rows:
            print(f"  {r['probe']:<45} measured {r['measured_step_s']:.3f} s, forecast {r['predicted_step_s']:.3f} s "
                  f"({100 * r['error']:+.0f}%)")
        out[name] = {"worker_costs": costs, "probes": rows, "file": path}
    save_disk(machine, replace(base, worker_costs=out["after"]["worker_costs"], worker_costs_source=(
        "fitted by benchmarks/page_cache_forecast.py on calibrate's probes (per tile)")))
    print(json.dumps({**out, "disk_node": disk.describe(), "conditions": conditions,
                      "load_after": os.getloadavg()}))
    return 0


def forecast(args) -> int:
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model
    from tilecast.loop.config import StepConfig
    from tilecast.loop.predict import predict, stored_models
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.disk_node import load_disk
    from tilecast.perfmodel.local import run_conditions
    from tilecast.perfmodel.page_cache import page_cache_for, run_process_bytes
    from tilecast.executor.memory_limit import parse_size
    from tilecast.simulator.memory_capacity import MemoryForecast

    machine = load_machine("local")
    calibration, host_costs = stored_models(machine)
    conditions = run_conditions()
    disks = [load_disk(p) for p in args.disk]
    if args.device_gbps:
        w, r = (float(x) * 1e9 for x in args.device_gbps.split(","))
        disks = [replace(d, device_write_bandwidth=w, device_read_bandwidth=r) if d.has_device else d for d in disks]
    measured = {}
    if args.measured:
        with open(args.measured) as f:
            doc = json.loads([ln for ln in f.read().splitlines() if ln.startswith("{")][-1])
        measured = {(r["tiling"], r["limit"]): r for r in doc["rows"]}
    rows = []
    for item in args.configs.split(","):
        tile, limit = item.split(":")
        config = StepConfig(load_model(args.model), args.batch, args.seq, Tiling.parse(tile), args.sched,
                            args.workers)
        graph = config.build()
        limit_bytes = parse_size(limit)
        cache = None
        if args.cache_gib:
            proc = run_process_bytes(limit_bytes, graph.n_tiles)
            cache = page_cache_for(proc, available_bytes=int(args.cache_gib * 2**30) + proc)
        row = {"tiling": tile, "limit": limit, "forecasts": []}
        m = measured.get((tile, limit))
        if m:
            row["measured_step_s"] = m["measured_step_s"]
            row["disk_bytes"] = m["disk_bytes"]
        for path, disk in zip(args.disk, disks):
            t0 = time.perf_counter()
            p = predict(config, machine, calibration, host_costs, graph=graph,
                        memory=MemoryForecast(limit_bytes, replace(disk, walk_s=0.0), cache))
            s = p.summary
            f = {"disk": path, "step_s": p.step_s, "written": s["disk_written_bytes"], "read": s["disk_read_bytes"],
                 "simulated_in_s": time.perf_counter() - t0,
                 **{k: v for k, v in s.items() if k.startswith("page_cache")}}
            row["forecasts"].append(f)
            err = f" ({100 * (p.step_s - m['measured_step_s']) / m['measured_step_s']:+.0f}%)" if m else ""
            print(f"{item:<12} {os.path.basename(path):<20} forecast {p.step_s:9.2f} s{err}; "
                  f"{s['disk_written_bytes'] / 1e9:.3f} GB written, {s['disk_read_bytes'] / 1e9:.3f} GB read"
                  + (f"; {s['page_cache']}, read misses {s['page_cache_read_misses']}/"
                     f"{s['page_cache_read_misses'] + s['page_cache_read_hits']}, writers throttled during "
                     f"{s['page_cache_throttled_wall_s']:.1f} s" if "page_cache" in s else ""), flush=True)
        if m:
            print(f"{item:<12} measured {m['measured_step_s']:.2f} s (repeats "
                  f"{', '.join(f'{x:.2f}' for x in m['repeats_step_s'])})", flush=True)
        rows.append(row)
    print(json.dumps({"model": args.model, "batch": args.batch, "seq": args.seq, "rows": rows,
                      "conditions": conditions, "load_after": os.getloadavg()}))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit")
    f.add_argument("--offload-dir", required=True, metavar="DIR")
    f.add_argument("--out", required=True, metavar="DIR")
    f.add_argument("--workers", type=int, default=2)
    g = sub.add_parser("forecast")
    g.add_argument("--disk", action="append", required=True, metavar="FILE")
    g.add_argument("--model", default="gpt2-tiny")
    g.add_argument("--batch", type=int, default=4)
    g.add_argument("--seq", type=int, default=128)
    g.add_argument("--configs", required=True, help="comma-separated TILE:LIMIT")
    g.add_argument("--sched", default="dmda")
    g.add_argument("--workers", type=int, default=2)
    g.add_argument("--measured", metavar="FILE", help="benchmarks/memory_forecast.py's output")
    g.add_argument("--cache-gib", type=float, default=0.0, help="the page cache the run leaves, GiB")
    g.add_argument("--device-gbps", default="", metavar="WRITE,READ", help="the device's bandwidth, GB/s")
    args = ap.parse_args()
    if args.cmd == "forecast":
        bad = [c for c in args.configs.split(",") if len(c.split(":")) != 2]
        if bad:
            print(f"page_cache_forecast: --configs: {bad[0]!r} is not TILE:LIMIT", file=sys.stderr)
            return 2
        if args.device_gbps and (len(args.device_gbps.split(",")) != 2
                                 or not all(x.replace(".", "", 1).isdigit() for x in args.device_gbps.split(","))):
            print(f"page_cache_forecast: --device-gbps: {args.device_gbps!r} is not WRITE,READ in GB/s",
                  file=sys.stderr)
            return 2
        missing = [p for p in args.disk if not os.path.isfile(p)]
        if missing:
            print(f"page_cache_forecast: --disk: no such file {missing[0]}", file=sys.stderr)
            return 2
    if args.cmd == "fit":
        if not os.path.isdir(args.offload_dir):
            print(f"page_cache_forecast: --offload-dir: no such directory {args.offload_dir}", file=sys.stderr)
            return 2
        return fit(args)
    return forecast(args)


if __name__ == "__main__":
    sys.exit(main())
