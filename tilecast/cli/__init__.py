"""The ``tilecast`` command: argument parsing and dispatch only.

Each subcommand lives in its own module of this package with two functions:
``add_parser(subparsers)`` declares its flags, ``run(args)`` calls the library
and returns the exit status (0 success, 1 a check or target failed, 2 bad input).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# Subcommand name -> module under tilecast.cli. Order is the order of --help.
COMMANDS = {
    "graph": "graph_cmd",
    "verify": "verify_cmd",
    "run": "run_cmd",
    "train": "train_cmd",
    "calibrate": "calibrate_cmd",
    "simulate": "simulate_cmd",
    "compare": "compare_cmd",
    "tune": "tune_cmd",
    "accuracy": "accuracy_cmd",
    "demo": "demo_cmd",
    "whatif": "whatif_cmd",
    "validate": "validate_cmd",
}


class UsageError(Exception):
    """Bad input: reported as one line on standard error, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tilecast",
        description="Forecast, then run, tiled training of GPT language models.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        mod = importlib.import_module(f"tilecast.cli.{module}")
        p = mod.add_parser(sub)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except UsageError as e:
        print(f"tilecast {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tilecast {args.command}: interrupted", file=sys.stderr)
        return 130
    except MemoryError:  # the last resort: steps known to be too large are refused before they are built
        print(f"tilecast {args.command}: out of memory (the step is too large for this machine: a coarser --tile, "
              "or a smaller --model, --batch or --seq)", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader closed the pipe (``| head``): stop without a traceback, and point standard output at
        # /dev/null so the interpreter's final flush does not raise again. 141 = 128 + SIGPIPE, what a
        # shell reports for a tool the signal ended.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
