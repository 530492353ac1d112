"""tilecast graph: the task graph of one training step, summarised."""

from __future__ import annotations

import sys

from tqdm import tqdm

from tilecast.cli import UsageError
from tilecast.cli.common import add_json_arg, add_model_args, add_recompute_arg, human, model_args, print_json, recompute_arg
from tilecast.cli.ranks_table import add_rank_args, print_rank_table

from tilecast.api import COMPARE_MAX_TASKS  # the recompute settings compared by default up to this many tasks


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
                    f"with --no-compare, or by default on steps of over {COMPARE_MAX_TASKS:,} tasks).")
    add_model_args(p)
    add_recompute_arg(p)
    p.add_argument("--no-compare", action="store_true",
                   help="do not build the step under the other --recompute settings (the default on steps of "
                        f"over {COMPARE_MAX_TASKS:,} tasks, where it doubles the time; --compare builds them)")
    p.add_argument("--compare", action="store_true",
                   help="build the step under every --recompute setting, however large")
    add_json_arg(p)
    add_rank_args(p, "also spread the step over N processes by --distribution and print, per rank, the tasks it "
                     "runs, the bytes it owns, sends and receives per step (StarPU-MPI's rules; --json: key ranks)")
    p.add_argument("--dot", metavar="FILE", help="also write a Graphviz picture of the graph (small graphs only; "
                                                  "'-' for standard output)")
    return p


def run(args) -> int:
    import tilecast as tc
    from tilecast.cli.common import library_errors
    from tilecast.graph.analysis import kernel_table
    from tilecast.graph.dot import MAX_DOT_TASKS, to_dot

    cfg, batch, seq, tiling = model_args(args)
    recompute = recompute_arg(args)
    if args.ranks is not None and args.ranks < 1:
        raise UsageError(f"--ranks must be at least 1, got {args.ranks}")
    compare = True if args.compare else False if args.no_compare else None
    bars = []

    def progress(n, total):
        if not bars:
            bars.append(tqdm(total=total, desc="critical path", unit="task", file=sys.stderr,
                             disable=total < 200_000, leave=False))
        bars[0].update(n)

    try:
        with library_errors():
            res = tc.graph(cfg, batch, seq, tiling, recompute, compare_recompute=compare, ranks=args.ranks,
                           distribution=args.distribution, progress=progress,
                           compare_max_tasks=COMPARE_MAX_TASKS)
    finally:
        for bar in bars:
            bar.close()
    graph, s, ranks = res.graph, res.summary, res.ranks
    if args.dot and graph.n_tasks > MAX_DOT_TASKS:
        raise UsageError(f"--dot: the graph has {graph.n_tasks} tasks; pictures are drawn for at most "
                         f"{MAX_DOT_TASKS} (use a smaller --model/--batch/--seq or larger --tile)")
    if compare is None and graph.n_tasks > COMPARE_MAX_TASKS:
        print(f"the other --recompute settings are not compared on a step of {graph.n_tasks:,} tasks "
              "(--compare builds them)", file=sys.stderr)
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
    if ranks is not None:
        print()
        print_rank_table(ranks)
    if args.dot:
        print(f"picture             {args.dot}")
    print()
    print(f"{'recompute':<11}{'tasks':>10}{'flops':>14}{'live peak':>14}{'activations':>14}")
    for setting, r in s["recompute_settings"].items():
        mark = "  <- this graph" if setting == recompute else ""
        print(f"{setting:<11}{r['tasks']:>10}{human(r['flops']):>14}{human(r['live_bytes'], 'B'):>14}"
              f"{human(r['live_activation_bytes'], 'B'):>14}{mark}")
    return 0
