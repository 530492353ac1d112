"""One command-line vocabulary: every flag name has one kind, one value type and one meaning across the
subcommands, and every ``tilecast ...`` line and repository path the README and docs/ show exists.

The parsers are walked, not listed: a flag added to one command is free, a flag shared by two must agree with
itself, and the flags of VOCABULARY must also say what the vocabulary says (docs/cli.md).
"""

import argparse
import glob
import os
import re

import pytest

from tilecast.cli import COMMANDS, build_parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# flag -> (value type, metavar, a phrase its help holds wherever it appears); None: not checked.
# A command that takes several values of a one-value flag has its own, plural name (--scheds, --tiles,
# --worker-counts).
VOCABULARY = {
    "--model": (None, None, "a preset"),
    "--batch": (int, None, None),
    "--seq": (int, None, None),
    "--tile": (None, "SPEC", "tile sizes"),
    "--tiles": (None, "SPEC;SPEC", "tilings"),
    "--recompute": (None, None, None),
    "--machine": (None, "NAME|FILE", "machine description"),
    "--sched": (None, "NAME", "policy"),
    "--scheds": (None, "LIST", "StarPU scheduling policies"),
    "--workers": (int, "N", "workers"),
    "--worker-counts": (None, "LIST", "worker counts"),
    "--steps": (int, "N", "training steps run and timed"),
    "--warmup": (int, "N", "warm-up steps"),
    "--seed": (int, "N", "seed of the weights"),
    "--out": (None, "DIR", "folder"),
    "--trace": (None, "FILE", "trace"),
    "--execute": (int, "K", "run the K best"),
    "--top": (int, None, None),
    "--json": (None, None, "JSON object on standard output"),
    "--ranks": (int, "N", None),
    "--memory-limit": (None, "SIZE", None),
    "--offload-dir": (None, "DIR", None),
}


def _uses():
    """flag -> [(command, action)] over every subcommand's parser."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    uses = {}
    for name, p in sub.choices.items():
        for a in p._actions:
            for flag in a.option_strings:
                if flag.startswith("--") and flag != "--help":
                    uses.setdefault(flag, []).append((name, a))
    return sub.choices, uses


SUBPARSERS, USES = _uses()


def _shape(action):
    """What must agree between two uses of a flag: the kind of action, the value type, one value or several."""
    nargs = None if action.nargs in (None, "?") else action.nargs  # an optional value is still one value
    return type(action).__name__, getattr(action.type, "__name__", action.type), nargs


def test_every_command_is_parsed_and_has_json():
    assert set(SUBPARSERS) == set(COMMANDS)
    for name, p in SUBPARSERS.items():
        assert "--json" in p._option_string_actions, f"{name} has no --json"
        assert p.format_help()  # every help text formats


def test_a_shared_flag_has_one_kind_type_and_metavar():
    problems = []
    for flag, uses in USES.items():
        shapes = {_shape(a) for _, a in uses}
        if len(shapes) > 1:
            problems.append(f"{flag}: " + "; ".join(f"{c} {_shape(a)}" for c, a in uses))
        metavars = {a.metavar for _, a in uses if a.metavar is not None}
        if len(metavars) > 1:
            problems.append(f"{flag}: metavars " + "; ".join(f"{c} {a.metavar}" for c, a in uses))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("flag", sorted(VOCABULARY))
def test_vocabulary_flags_say_what_the_vocabulary_says(flag):
    kind, metavar, phrase = VOCABULARY[flag]
    assert flag in USES, f"{flag} is in the vocabulary but no command takes it"
    for command, a in USES[flag]:
        if kind is not None:
            assert a.type is kind, f"{command} {flag}: type {a.type}, not {kind.__name__}"
        if metavar is not None and a.metavar is not None:
            assert a.metavar == metavar, f"{command} {flag}: metavar {a.metavar}, not {metavar}"
        if phrase is not None:
            assert phrase in (a.help or ""), f"{command} {flag}: help does not say {phrase!r}: {a.help!r}"


def test_no_list_valued_flag_shares_a_name_with_a_one_value_flag():
    # the words the commands once used for lists; each now has one meaning only
    for flag in ("--workers", "--sched", "--tile", "--seed", "--out", "--top"):
        for command, a in USES.get(flag, []):
            assert "LIST" not in (a.metavar or "") and "PREFIX" not in (a.metavar or ""), (command, flag)


# --- what the README and docs/ show -------------------------------------------------------------------------

DOCS = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
NOT_COMMANDS = {"rank"}  # "tilecast rank R: ..." is a line StarPU-MPI ranks print (docs/mpi.md)
COMMAND_LINE = re.compile(r"(?<!import )(?<![\w.-])tilecast ([a-z][a-z-]*)([^#]*)")
PATH = re.compile(r"(?<![\w/.-])((?:docs|benchmarks|tilecast|examples|tests)/[\w./*-]*[\w*])")


def _code(text):
    """(line number, code) of every fenced-block line (backslash continuations joined) and inline code span."""
    lines, out, fence, i = text.split("\n"), [], False, 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            fence = not fence
        elif fence:
            start = i
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i]
            out.append((start + 1, line))
        else:
            out += [(i + 1, m.group(1)) for m in re.finditer(r"`([^`]+)`", line)]
        i += 1
    return out


def test_docs_show_only_commands_and_flags_that_exist():
    flags = {name: set(p._option_string_actions) for name, p in SUBPARSERS.items()}
    problems, seen = [], 0
    for doc in DOCS:
        for line, code in _code(open(os.path.join(ROOT, doc)).read()):
            for m in COMMAND_LINE.finditer(code):
                command, rest = m.groups()
                if command in NOT_COMMANDS:
                    continue
                seen += 1
                if command not in flags:
                    problems.append(f"{doc}:{line}: no command {command!r} ({code[:80]})")
                    continue
                for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest):
                    if flag not in flags[command]:
                        problems.append(f"{doc}:{line}: tilecast {command} has no {flag} ({code[:100]})")
    assert seen > 50  # the extraction finds the docs' command lines
    assert not problems, "\n".join(problems)


def test_docs_name_only_paths_that_exist():
    problems = []
    for doc in DOCS:
        text = open(os.path.join(ROOT, doc)).read()
        for m in PATH.finditer(text):
            path = m.group(1).rstrip(".")
            here = [os.path.join(ROOT, path), os.path.join(ROOT, os.path.dirname(doc), path)]
            if not any(glob.glob(p) for p in here):
                problems.append(f"{doc}:{text[:m.start()].count(chr(10)) + 1}: no such path {path}")
    assert not problems, "\n".join(problems)


# --- the --json keys docs/cli.md documents -------------------------------------------------------------------

def _documented_keys(command: str) -> set:
    text = open(os.path.join(ROOT, "docs", "cli.md")).read()
    section = re.search(rf"^### {command}\n(.*?)(?=^#)", text + "\n#", re.S | re.M).group(1)
    return set(re.findall(r"`([a-z_]+)`", section))


TINY = ["--model", "gpt2-tiny", "--batch", "2", "--seq", "32", "--tile", "32"]


def _json(capsys, argv) -> dict:
    import json

    from tilecast.cli import main

    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_keys_of_graph_simulate_and_compare_are_documented(tmp_path, capsys):
    graph = _json(capsys, ["graph", *TINY])
    pred = _json(capsys, ["simulate", *TINY, "--machine", "h100-sxm5-80gb-8", "--out", str(tmp_path / "p")])
    policies = _json(capsys, ["simulate", *TINY, "--machine", "h100-sxm5-80gb-8", "--compare-policies"])
    trace = pred["trace"]["table"]
    comparison = _json(capsys, ["compare", trace, trace, "--any-source", "--no-chrome", "--out", str(tmp_path / "r")])
    for command, doc in (("graph", graph), ("simulate", pred), ("simulate", policies), ("compare", comparison)):
        missing = set(doc) - _documented_keys(command)
        assert not missing, f"docs/cli.md does not document {command} --json keys {sorted(missing)}"


# --- bad input: one line naming the flag, from the library's field names -------------------------------------

@pytest.mark.parametrize("argv, start", [
    (["tune", *TINY, "--machine", "h100-sxm5-80gb-8", "--worker-counts", "1,99"], "--worker-counts: worker count 99"),
    (["tune", *TINY, "--machine", "h100-sxm5-80gb-8", "--workers", "99"], "--workers: worker count 99"),
    (["tune", *TINY, "--workers", "1", "--worker-counts", "1,2"], "--workers/--worker-counts:"),
    (["tune", *TINY, "--machine", "h100-sxm5-80gb-8", "--scheds", "nosuch"], "--scheds: none of"),
    (["tune", *TINY, "--tiles", "32;foo=1"], "--tiles: unknown dimension 'foo'"),
    (["calibrate", *TINY, "--tiles", "32,64,bar=2"], "--tiles: unknown dimension 'bar'"),
    (["verify", *TINY, "--recompute", "sometimes"], "--recompute: must be one of"),
    (["simulate", *TINY, "--seq", "9999"], "--seq 9999 exceeds"),
    (["demo", "--execute", "0"], "--execute must be at least 1"),
    (["accuracy", "--worker-counts", "0"], "--worker-counts must be positive"),
])
def test_bad_input_is_one_line_naming_the_flag(argv, start, capsys):
    from tilecast.cli import main

    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1, captured.err
    assert lines[0].startswith(f"tilecast {argv[0]}: {start}"), lines[0]


def test_a_list_where_one_value_goes_is_refused_by_the_parser(capsys):
    from tilecast.cli import main

    with pytest.raises(SystemExit) as e:
        main(["tune", *TINY, "--workers", "1,2"])
    assert e.value.code == 2 and "--workers: invalid int value" in capsys.readouterr().err
