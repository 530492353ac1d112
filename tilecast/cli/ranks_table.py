"""The per-rank table of a step distributed over ranks (``tilecast graph --ranks``), and its flags."""

from __future__ import annotations

from tilecast.cli import UsageError
from tilecast.cli.common import as_flags, human


def add_rank_args(p, ranks_help: str) -> None:
    """--ranks and --distribution, the same wherever a step is spread over processes."""
    from tilecast.graph.distribution import DISTRIBUTIONS

    p.add_argument("--ranks", type=int, default=None, metavar="N", help=ranks_help)
    p.add_argument("--distribution", default="data", metavar="NAME",
                   help="which rank owns each tile: " + "; ".join(f"{k}: {v}" for k, v in DISTRIBUTIONS.items())
                        + " (default: data; docs/mpi.md)")


# flags of run, train, simulate and tune that a step on several ranks does not take yet (docs/mpi.md, "Not done
# yet"), with why: given with --ranks they are refused rather than ignored
_IN_MEMORY = "each rank keeps its tiles in memory: no limit, no disk node"
_NO_EVAL = "training on several ranks computes no validation loss"
NOT_WITH_RANKS = (("memory_limit", "--memory-limit", _IN_MEMORY), ("offload_dir", "--offload-dir", _IN_MEMORY),
                  ("eval_every", "--eval-every", _NO_EVAL), ("eval_batches", "--eval-batches", _NO_EVAL))


def refuse_with_ranks(args) -> None:
    """UsageError (one line) naming the first flag of :data:`NOT_WITH_RANKS` given with --ranks."""
    for attr, flag, why in NOT_WITH_RANKS:
        if getattr(args, attr, None) is not None:
            raise UsageError(f"{flag}: not with --ranks yet ({why}; docs/mpi.md)")


def distribute_args(graph, args):
    """(graph to run, Distribution) as the flags ask (tilecast.graph.distribution.prepare); UsageError (one
    line, naming the flag) when the ranks do not fit."""
    from tilecast.errors import FieldError
    from tilecast.graph.distribution import prepare

    if args.ranks is not None and args.ranks < 1:
        raise UsageError(f"--ranks must be at least 1, got {args.ranks}")
    try:
        return prepare(graph, args.ranks, args.distribution)
    except FieldError as e:  # names ranks or distribution
        raise UsageError(as_flags(str(e))) from None


def print_rank_table(fig: dict) -> None:
    grid = f", {fig['rank_grid'][0]} x {fig['rank_grid'][1]} rank grid" if fig["rank_grid"] else ""
    print(f"distribution {fig['distribution']} over {fig['ranks']} ranks{grid}; StarPU-MPI's owner-computes rule, "
          f"received tiles cached until written")
    print(f"{'rank':>5}{'tasks':>9}{'flops':>12}{'owned':>12}{'sent':>12}{'received':>12}{'msgs out':>10}"
          f"{'msgs in':>9}")
    for r in fig["per_rank"]:
        print(f"{r['rank']:>5}{r['tasks']:>9}{human(r['flops']):>12}{human(r['owned_bytes'], 'B'):>12}"
              f"{human(r['bytes_sent'], 'B'):>12}{human(r['bytes_received'], 'B'):>12}{r['messages_sent']:>10}"
              f"{r['messages_received']:>9}")
    print(f"moved per step      {human(fig['bytes_moved'], 'B')} in {fig['messages']} messages"
          + (f" ({human(fig['bytes_sent_back'], 'B')} written away from their owner and sent back)"
             if fig["bytes_sent_back"] else ""))
    if fig["tasks_placed_by_most_data"]:
        print(f"tasks whose written tiles have several owners (placed by StarPU-MPI's most-data policy): "
              f"{fig['tasks_placed_by_most_data']}")
