"""How well the shape model extrapolates memory-bound kernels past the caches, without and with cache regimes.

Times memory-bound kernels (AdamW, SwiGLU, axpy, softmax statistics, the cross-entropy gradient, the
embedding's gather and its gradient) over working sets from 64 KiB to ``--max-mib`` (doubling: across this
machine's level-2 and last-level caches), and square GEMMs 48-384 as the compute-bound check, with the C
kernels alone on one BLAS thread. Then, on those same timings, side by side:

- ``extrapolation_errors`` (the 2 largest sizes of each kernel each predicted from the smaller ones alone),
  the shape model as it was (no cache regimes) and with the machine's regimes
  (:func:`tilecast.perfmodel.cache_regimes.machine_regimes`);
- a cut: every shape whose working set exceeds ``cut`` predicted from those within it, for a cut at a quarter
  of the last-level cache (nothing timed beyond it) and at twice it (two sizes timed beyond it).

With ``--model`` (e.g. llama2-7b at ``--batch 1 --seq 256``), the shapes are instead those of ``tilecast
tune``'s candidate graphs of that model: the design first-use calibration times under the default budget and
the bound (StarPU's 2 lanes), what :func:`~tilecast.perfmodel.calibration_design.past_cache` adds to it, and,
as the truth, the shapes over the bound of the memory-bound kernels and GEMM whose buffers take at most a
quarter of the memory available (one lane here, so they can be timed); each over-bound shape is predicted from
the design's timings by the model as it was, with the regimes, and with the regimes and the added shapes.

Ends with one JSON line of the figures. ``--save F`` keeps the timings (a calibration file), ``--load F``
evaluates stored ones without timing.

    python3 benchmarks/membound_extrapolation.py [--max-mib 512] [--repeats 5] [--save F | --load F]
    python3 benchmarks/membound_extrapolation.py --model llama2-7b --batch 1 --seq 256 [--save F | --load F]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from tilecast.kernels import get
from tilecast.perfmodel import load_machine
from tilecast.perfmodel.cache_regimes import machine_regimes, working_set
from tilecast.perfmodel.cache_size import last_level
from tilecast.perfmodel.calibration import Calibration, calibrate, gemm_cases
from tilecast.perfmodel.shape_model import ShapeModel, extrapolation_errors
from tilecast.perfmodel.timers import c_kernel_timer

MIN_WS = 64 << 10


def family(name: str, ws: float) -> np.ndarray:
    """A shape of kernel ``name`` whose buffers take about ``ws`` bytes."""
    if name == "adamw":
        n = ws // 16
        return np.array([n, 1e-3, 0.9, 0.95, 1e-8, 0.1, 1.0, 4 * n, 4 * n, 4 * n, 4 * n])
    if name == "swiglu":
        n = ws // 12
        return np.array([n, 4 * n, 4 * n, 4 * n])
    if name == "axpy":
        n = ws // 8
        return np.array([n, 1.0, 4 * n, 4 * n])
    if name == "softmax_stats":  # rows of 1024 scores
        rows = max(ws // 4104, 1)
        return np.array([rows, 1024, 0.0, 4 * rows * 1024, 8 * rows])
    if name == "ce_grad":  # 256 rows, a vocabulary tile of vt
        vt = max((ws - 4096) // 1024, 1)
        return np.array([256, vt, 0.0, 1.0 / 256, 4 * 256 * vt, 8 * 256, 8 * 256])
    if name in ("embed", "embed_bwd"):  # 256 tokens of 512 wide, a vocabulary tile of vt rows
        vt = max((ws - 256 * 8 - 256 * 512 * 4) // 2048, 16)
        if name == "embed":
            return np.array([256, vt, 512, 0, 0.0, 256 * 8, 4 * vt * 512, 4 * 256 * 512])
        return np.array([256, vt, 512, 0, 0.0, 256 * 8, 4 * 256 * 512, 4 * vt * 512])
    raise KeyError(name)


KERNELS = ("adamw", "swiglu", "axpy", "softmax_stats", "ce_grad", "embed", "embed_bwd")


def cases(max_bytes: float) -> list:
    out = []
    for name in KERNELS:
        ws = MIN_WS
        while ws <= max_bytes:
            out.append((name, family(name, ws).astype(np.float64)))
            ws *= 2
    return out + gemm_cases([48, 96, 192, 384])


def cut_errors(cal: Calibration, name: str, cut: float, caches) -> dict | None:
    """Shapes whose working set exceeds ``cut`` predicted from the others alone: median and largest error."""
    shapes, t = cal.arrays(name)
    k = get(name)
    ws = working_set(k.id, shapes)
    fit, test = ws <= cut, ws > cut
    if fit.sum() < 3 or not test.any():
        return None
    err = np.abs(ShapeModel.fit(k.id, shapes[fit], t[fit], caches=caches).predict(shapes[test]) - t[test]) / t[test]
    return {"n": int(test.sum()), "median": float(np.median(err)), "max": float(err.max())}


def pct(r) -> str:
    return "     -" if r is None else f"{100 * r['median']:5.0f}% {100 * r['max']:5.0f}%"


def model_cases(machine, model: str, batch: int, seq: int) -> dict:
    """The design's timed cases of a model's candidate graphs, the past-cache additions and the over-bound
    cases to time as the truth (see the module's docstring), each a list of (kernel, shape)."""
    from tilecast.graph.model_config import load_model
    from tilecast.graph.size_estimate import available_memory
    from tilecast.loop.kernel_calibration import (BUDGET_S, HOT_PASSES, STARPU_PASSES, bounded_cases, buffer_bytes,
                                                  estimated_seconds, missing_cases, starpu_repeats, timing_cost_s)
    from tilecast.loop.tune import build_candidates
    from tilecast.perfmodel.calibration_design import choose_timed, past_cache

    lanes = 2
    graphs, _ = build_candidates(load_model(model), batch, seq)
    todo = missing_cases(None, [g for _, g in graphs])
    del graphs
    est = estimated_seconds(machine, todo)
    cost = timing_cost_s(todo, est, starpu_repeats(est), lanes, STARPU_PASSES + HOT_PASSES)
    over, _ = bounded_cases(machine, None, todo, lanes)
    timed, _ = choose_timed(todo, cost, BUDGET_S, over=over)
    caches = machine_regimes(machine.kinds[machine.kind_names[0]], None, lanes=lanes)
    add, made = past_cache(todo, over, timed, caches)
    room = available_memory() / 4
    one_lane = buffer_bytes(todo, 1)
    truth = [todo[i] for i in np.flatnonzero(over) if one_lane[i] <= room
             and (todo[i][0] == "gemm" or caches.memory_bound(get(todo[i][0]).id, todo[i][1][None])[0])]
    return {"design": [todo[i] for i in sorted(timed)], "added": [todo[i] for i in add] + made, "truth": truth}


def model_report(machine, cal: Calibration, groups: dict) -> dict:
    """Per kernel with shapes in the truth: their prediction errors from the design's timings."""
    kind = machine.kinds[machine.kind_names[0]]
    caches = machine_regimes(kind, cal)

    def keys(group):
        return {(n, tuple(float(x) for x in r)) for n, r in groups[group]}

    design, added, truth = keys("design"), keys("added"), keys("truth")
    out = {}
    print(f"{'kernel':<14}{'shapes':>7}{'decades':>9}{'as it was':>15}{'regimes':>15}{'+ added':>15}"
          "   (median, max relative error on the shapes over the bound)")
    for name in sorted({n for n, _ in truth}):
        shapes, t = cal.arrays(name)
        key = [(name, tuple(float(x) for x in r)) for r in shapes.tolist()]
        fit = np.array([x in design for x in key])
        more = fit | np.array([x in added for x in key])
        test = np.array([x in truth for x in key])
        if fit.sum() < 3 or not test.any():
            continue
        k = get(name)
        row = {"n": int(test.sum())}
        line = ""
        for label, rows, c in (("as_it_was", fit, None), ("regimes", fit, caches), ("added", more, caches)):
            model = ShapeModel.fit(k.id, shapes[rows], t[rows], caches=c)
            err = np.abs(model.predict(shapes[test]) - t[test]) / t[test]
            row[label] = {"median": float(np.median(err)), "max": float(err.max())}
            line += f"{pct(row[label]):>15}"
            row["decades"] = float(model.beyond(shapes[test]).max())
        out[name] = row
        print(f"{name:<14}{row['n']:>7}{row['decades']:>9.2f}{line}")
    alone = Calibration(cal.machine, cal.fingerprint, cal.kind, cal.timer, kernels=cal.kernels)
    for name, e in cal.points.items():  # the design's timings alone: the held-out figure calibration prints
        for shape, m, d in zip(e["shapes"], e["median_s"], e["mad_s"]):
            if (name, tuple(shape)) in design:
                alone.add(name, shape, m, d)
    before, after = extrapolation_errors(alone), extrapolation_errors(alone, caches=caches)
    print("held out on the design's timings (the 2 largest sizes from the smaller alone), as it was and with regimes:")
    for name in before:
        b, a = before[name], after[name]
        out.setdefault(name, {})["heldout"] = {"as_it_was": b, "regimes": a}
        print(f"  {name:<16}{b['n_fit']:>4} timed {b['n_heldout']:>3} held out {b['decades']:.2f} decades"
              f"{pct({'median': b['median_rel_err'], 'max': b['max_rel_err']}):>15}"
              f"{pct({'median': a['median_rel_err'], 'max': a['max_rel_err']}):>15}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-mib", type=float, default=512.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--save")
    ap.add_argument("--load")
    ap.add_argument("--model")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=256)
    args = ap.parse_args()
    machine = load_machine("local")
    kind = machine.kinds[machine.kind_names[0]]
    load0 = os.getloadavg()[0]
    start = time.monotonic()
    if args.model:
        groups = model_cases(machine, args.model, args.batch, args.seq)
        print(f"{args.model} {args.batch} x {args.seq}: {len(groups['design'])} shapes in the design, "
              f"{len(groups['added'])} added past the cache ({', '.join(n for n, _ in groups['added'])}), "
              f"{len(groups['truth'])} over the bound timed as the truth (built in {time.monotonic() - start:.0f} s)",
              flush=True)
        if args.load:
            cal = Calibration.load(args.load)
        else:
            timer = c_kernel_timer()
            every = groups["design"] + groups["added"]
            cal = calibrate(machine, every, repeats=args.repeats, timer=timer, timer_name="c-kernels")
            cal.add_all(calibrate(machine, groups["truth"], repeats=2, timer=timer, timer_name="c-kernels"))
            if args.save:
                cal.save(args.save)
        wall = time.monotonic() - start
        print(f"conditions: {machine.description}; load average {load0:.1f} -> {os.getloadavg()[0]:.1f}; "
              f"{wall:.0f} s in all; C kernels alone, one BLAS thread")
        report = model_report(machine, cal, groups)
        print(json.dumps({"model": args.model, "load_before": load0, "load_after": os.getloadavg()[0],
                          "wall_s": wall, "kernels": report}))
        return
    if args.load:
        cal = Calibration.load(args.load)
    else:
        timer = c_kernel_timer()
        if timer is None:
            print("membound_extrapolation: the C kernels could not be built here", file=sys.stderr)
            sys.exit(2)
        cal = calibrate(machine, cases(args.max_mib * 2**20), repeats=args.repeats, timer=timer,
                        timer_name="c-kernels")
        if args.save:
            cal.save(args.save)
    wall = time.monotonic() - start
    caches = machine_regimes(kind, cal)
    llc, sharing, llc_source = last_level()
    share = llc / max(1, min(cal.lane_workers or 1, sharing))
    print(f"conditions: {machine.description}; load average {load0:.1f} -> {os.getloadavg()[0]:.1f}; "
          f"timing {wall:.0f} s; last-level cache {llc_source}")
    print(f"regimes: working sets up to {', '.join(f'{b / 2**20:g} MiB' for b in caches.bounds)}; memory "
          f"{caches.memory_bps / 1e9:.1f} GB/s; memory-bound below {caches.balance:.1f} flops per byte")
    names = list(KERNELS) + ["gemm"]
    before = extrapolation_errors(cal, kernels=names)
    after = extrapolation_errors(cal, kernels=names, caches=caches)
    cuts = {"quarter_llc": share / 4, "twice_llc": 2 * share}
    out = {"conditions": {"cpu": machine.description, "load_before": load0, "load_after": os.getloadavg()[0],
                          "bounds": list(caches.bounds), "memory_GBps": caches.memory_bps / 1e9,
                          "balance": caches.balance, "timing_s": wall}, "kernels": {}}
    heads = [f"cut at {c / 2**20:g} MiB" for c in cuts.values()]
    print(f"{'kernel':<14}{'held out (2 largest)':>26}{'':>9}{heads[0]:>26}{heads[1]:>26}")
    print(f"{'':<14}{'before':>13}{'after':>13}{'decades':>9}" + f"{'before':>13}{'after':>13}" * 2
          + "   (median, max relative error)")
    for name in names:
        if name not in before:
            continue
        b, a = before[name], after[name]
        row = {"heldout_before": b, "heldout_after": a}
        line = (f"{name:<14}{pct({'median': b['median_rel_err'], 'max': b['max_rel_err']}):>13}"
                f"{pct({'median': a['median_rel_err'], 'max': a['max_rel_err']}):>13}{b['decades']:>9.2f}")
        for label, cut in cuts.items():
            cb, ca = cut_errors(cal, name, cut, None), cut_errors(cal, name, cut, caches)
            row[f"{label}_before"], row[f"{label}_after"] = cb, ca
            line += f"{pct(cb):>13}{pct(ca):>13}"
        out["kernels"][name] = row
        print(line)
    for name in KERNELS:  # the measured rate per byte across the sizes, for the record
        shapes, t = cal.arrays(name)
        k = get(name)
        ws = working_set(k.id, shapes)
        from tilecast.perfmodel.shapes import shape_bytes

        gbps = shape_bytes(k.id, shapes[:, len(k.params):]) / t / 1e9
        print(f"  {name:<13} GB/s by working set: " + " ".join(f"{w / 2**20:g}M:{g:.1f}" for w, g in zip(ws, gbps)))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
