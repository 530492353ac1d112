"""tilecast graph: the task graph of one training step, summarised."""

from __future__ import annotations

import sys

from tqdm import tqdm

from tilecast.cli import UsageError
from tilecast.cli.common import add_json_arg, add_model_args, add_recompute_arg, human, model_args, print_json, recompute_arg


def add_parser(sub):
    p = sub.add_parser(
        "graph", help="build a training step's task graph and summarise it",
        description="Build the tiled task graph of one training step (forward, loss, backward, AdamW) "
                    "and print tasks per kernel with flops and bytes, the number of tiles, total flops, the "
                    "peak memory of the step's live tiles when tasks run one at a time in submission order "
                    "(parameters, gradients, AdamW moments and inputs for the whole step; any other tile from "
                    "its first write to its last read), and the critical path in flops; then tasks, flops and "
                    "peak live memory of the same step under each --recompute setting. --json keys: tasks, "
                    "tiles, flops, bytes (read and written, bytes), live_bytes (peak live memory, bytes), "
                    "live_persistent_bytes (its whole-step part, bytes), live_activation_bytes (the rest at the "
                    "peak, bytes), live_peak_tag (the tag of the task where the peak is first reached), "
                    "critical_path_flops, kernels (per kernel: tasks, flops, bytes), recompute (the setting), "
                    "recompute_settings (per setting: tasks, flops, live_bytes, live_activation_bytes; the chosen one only "
                    "with --no-compare).")
    add_model_args(p)
    add_recompute_arg(p)
    p.add_argument("--no-compare", action="store_true",
                   help="do not build the step under the other --recompute settings (about half the time on "
                        "graphs of millions of tasks)")
    add_json_arg(p)
    p.add_argument("--dot", metavar="FILE", help="also write a Graphviz picture of the graph (small graphs only; "
                                                  "'-' for standard output)")
    return p


def run(args) -> int:
    from tilecast.graph.analysis import kernel_table, summary
    from tilecast.graph.dot import MAX_DOT_TASKS, to_dot
    from tilecast.graph.models import build_step

    from tilecast.graph.recompute import RECOMPUTE

    cfg, batch, seq, tiling = model_args(args)
    recompute = recompute_arg(args)
    graph = build_step(cfg, batch, seq, tiling, recompute=recompute)
    if args.dot and graph.n_tasks > MAX_DOT_TASKS:
        raise UsageError(f"--dot: the graph has {graph.n_tasks} tasks; pictures are drawn for at most "
                         f"{MAX_DOT_TASKS} (use a smaller --model/--batch/--seq or larger --tile)")
    with tqdm(total=graph.n_tasks, desc="critical path", unit="task", file=sys.stderr,
              disable=graph.n_tasks < 200_000, leave=False) as bar:
        s = summary(graph, progress=bar.update)
    s["recompute"] = recompute
    s["recompute_settings"] = {}
    for setting in [recompute] if args.no_compare else RECOMPUTE:
        g = graph if setting == recompute else build_step(cfg, batch, seq, tiling, recompute=setting)
        s["recompute_settings"][setting] = recompute_figures(g)
        del g
    if args.dot:
        dot = to_dot(graph)
        if args.dot == "-":
            sys.stdout.write(dot)
            return 0
        with open(args.dot, "w") as f:
            f.write(dot)
    if args.json:
        print_json(s)
        return 0
    table = kernel_table(graph)
    print(f"{cfg.name}: {cfg.n_layer} layers, n_embd {cfg.n_embd}, {cfg.n_head} heads, vocab {cfg.vocab_size}, "
          f"{cfg.n_params() / 1e6:.1f} M parameters; batch {batch} x {seq} tokens; tiling {tiling}; "
          f"recompute {recompute}")
    print()
    print(f"{'kernel':<16}{'tasks':>10}{'flops':>14}{'bytes':>14}{'flops %':>9}")
    total = max(s["flops"], 1.0)
    for r in table.itertuples():
        print(f"{r.kernel:<16}{r.tasks:>10}{human(r.flops):>14}{human(r.bytes, 'B'):>14}{100 * r.flops / total:>8.1f}%")
    print()
    print(f"tasks               {s['tasks']}")
    print(f"tiles               {s['tiles']}")
    print(f"flops               {human(s['flops'])} ({s['flops']:.4g})")
    print(f"bytes touched       {human(s['bytes'], 'B')}")
    print(f"live memory (peak)  {human(s['live_bytes'], 'B')} ({human(s['live_persistent_bytes'], 'B')} for the "
          f"whole step, {human(s['live_activation_bytes'], 'B')} of activations, at {s['live_peak_tag']})")
    print(f"critical path       {human(s['critical_path_flops'])} flops "
          f"(average parallelism {s['flops'] / max(s['critical_path_flops'], 1):.1f})")
    if args.dot:
        print(f"picture             {args.dot}")
    print()
    print(f"{'recompute':<11}{'tasks':>10}{'flops':>14}{'live peak':>14}{'activations':>14}")
    for setting, r in s["recompute_settings"].items():
        mark = "  <- this graph" if setting == recompute else ""
        print(f"{setting:<11}{r['tasks']:>10}{human(r['flops']):>14}{human(r['live_bytes'], 'B'):>14}"
              f"{human(r['live_activation_bytes'], 'B'):>14}{mark}")
    return 0


def recompute_figures(graph) -> dict:
    """What the comparison of recompute settings shows for one step's graph."""
    from tilecast.graph.analysis import live_memory

    live = live_memory(graph)
    return {"tasks": int(graph.n_tasks), "flops": float(graph.flops.sum()), "live_bytes": live["peak_bytes"],
            "live_activation_bytes": live["activation_peak_bytes"]}
