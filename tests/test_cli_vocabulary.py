"""One command-line vocabulary: every flag name has one kind, one value type and one meaning across the
subcommands; every ``tilecast ...`` line and repository path the README and docs/ show exists, and every module
docs/design.md names; docs/cli.md lists the commands that take each shared flag, and each command's --json keys
exactly as the commands print them.

The parsers are walked, not listed: a flag added to one command is free, a flag shared by two must agree with
itself, and the flags of VOCABULARY must also say what the vocabulary says (docs/cli.md).
"""

import argparse
import glob
import os
import re

import pytest

from tilecast.cli import COMMANDS, build_parser

import json_keys
from loop_home import loop_home, loop_home_dir  # noqa: F401

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


def test_the_shared_flags_table_names_the_commands_that_take_each_flag():
    """docs/cli.md's table of shared flags: a command named in a row's last cell (outside parentheses) takes
    every flag of the row, and every command that takes one of them is named there (in parentheses or not)."""
    text = open(os.path.join(ROOT, "docs", "cli.md")).read()
    table = text[text.index("## Shared flags"):text.index("## Errors and exit status")]
    problems, rows = [], 0
    for first, last in re.findall(r"^\| (`--[^|]*)\|[^|]*\|[^|]*\| ([^|]*) \|$", table, re.M):
        rows += 1
        flags = re.findall(r"`(--[a-z-]+)`", first)
        named = set(re.findall(r"[a-z]+", last)) & set(SUBPARSERS)
        outside = set(re.findall(r"[a-z]+", re.sub(r"\(.*?\)", "", last))) & set(SUBPARSERS)
        if "every command" in last:
            named = outside = set(SUBPARSERS)
        for flag in flags:
            takes = {command for command, _ in USES.get(flag, [])}
            if outside - takes:
                problems.append(f"{flag}: {sorted(outside - takes)} named but do not take it")
            if takes - named:
                problems.append(f"{flag}: {sorted(takes - named)} take it but are not named")
    assert rows >= 15
    assert not problems, "\n".join(problems)


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


PACKAGES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "tilecast", "*"))
                  if os.path.isdir(p) and not p.endswith("__pycache__"))


def _exists_dotted(name: str) -> bool:
    """``cli.common.as_flags``, ``tilecast.home.home``: the longest module prefix imports and has the rest."""
    import importlib

    parts = name.split(".")
    parts = parts if parts[0] == "tilecast" else ["tilecast", *parts]
    for i in range(len(parts), 0, -1):
        base = os.path.join(ROOT, *parts[:i])
        if os.path.exists(base + ".py") or os.path.isdir(base):
            obj = importlib.import_module(".".join(parts[:i]))
            for attr in parts[i:]:
                if not hasattr(obj, attr):
                    return False
                obj = getattr(obj, attr)
            return True
    return False


def test_design_names_only_modules_that_exist():
    """Every module docs/design.md cites in code spans, as a path inside the package (`graph/deps.py`,
    `tilecast/kernels/c`) or a dotted name (`cli.common.as_flags`, `tilecast.home.home()`), exists."""
    text = re.sub(r"^```.*?^```", "", open(os.path.join(ROOT, "docs", "design.md")).read(), flags=re.S | re.M)
    roots = set(PACKAGES) | {"tilecast", "docs", "tests", "benchmarks", "examples"}
    modules = set(PACKAGES) | {"tilecast", "trace", "home", "atomic_file", "errors"}
    problems, seen = [], 0
    for span in re.findall(r"`([^`\n]+)`", text):
        for name in re.findall(r"[A-Za-z_][\w./*-]*[\w/*]", span):
            first = re.split(r"[./]", name)[0]
            if "/" in name and first in roots:
                seen += 1
                if not any(glob.glob(os.path.join(ROOT, r, name.rstrip("/"))) for r in ("", "tilecast")):
                    problems.append(f"no such path {name}")
            elif "." in name and first in modules and not re.search(r"\.(md|json|yaml|parquet|csv|py|c|h)$", name):
                seen += 1
                if not _exists_dotted(name):
                    problems.append(f"no such module or name {name}")
            elif name.endswith(".py"):  # a file named alone: somewhere in the package
                seen += 1
                if not glob.glob(os.path.join(ROOT, "tilecast", "**", name), recursive=True):
                    problems.append(f"no module {name} in tilecast/")
    assert seen > 50  # the extraction finds the design's module names
    assert not problems, "\n".join(problems)


# --- the --json keys docs/cli.md documents, both ways -------------------------------------------------------

TINY = ["--model", "gpt2-tiny", "--batch", "2", "--seq", "32", "--tile", "32"]
H100 = ["--machine", "h100-sxm5-80gb-8"]
ONE = ["--workers", "1", "--sched", "eager"]
LAYOUT = ["--cluster", "dgx-h100", "--model", "llama2-7b", "--seq", "2048", "--global-batch", "64"]
RANKS = [*TINY[:6], "--tile", "32,batch=1", "--ranks", "2"]
SERVE = ["--inference", "--cluster", "dgx-h100", "--model", "llama2-7b", "--input-len", "128", "--output-len", "16"]

# docs/cli.md's section -> the command lines, small settings, whose --json objects it documents; together they
# print every key the section lists ({tmp}: an empty folder; {trace}: a simulated trace file).
JSON_RUNS = {
    "graph": [["graph", *TINY], ["graph", *TINY[:6], "--tile", "32,batch=1", "--ranks", "2"]],
    "verify": [["verify", *TINY]],
    "run": [["run", *TINY, *ONE, "--steps", "2", "--check", "--trace", "{tmp}/run.parquet"],
            ["run", *TINY, *ONE, "--steps", "2", "--memory-limit", "2MiB", "--offload-dir", "{tmp}"]],
    "train": [["train", *TINY, *ONE, "--steps", "2", "--eval-every", "1", "--eval-batches", "1",
               "--checkpoint", "{tmp}/ck"]],
    "calibrate": [["calibrate", *TINY, "--tiles", "32", "--repeats", "2", "--per-kernel", "2",
                   "--output", "{tmp}/cal.json"]],
    "simulate": [["simulate", *TINY, *H100, "--out", "{tmp}/pred"],
                 ["simulate", *TINY, *H100, "--compare-policies"],
                 ["simulate", *TINY, "--workers", "1", "--sched", "eager", "--memory-limit", "2MiB",
                  "--offload-dir", "{tmp}", "--no-trace"]],
    "compare": [["compare", "{trace}", "{trace}", "--any-source", "--no-chrome", "--before", "{trace}",
                 "--out", "{tmp}/report"]],
    "tune": [["tune", *TINY[:6], *H100, "--tiles", "32;64", "--scheds", "eager"]],
    "simulate --ranks": [["simulate", *RANKS, "--distribution", "layer", "--network", "5,10,10"]],
    "tune --ranks": [["tune", *TINY[:6], "--tiles", "32;32,batch=1", "--ranks", "2", "--scheds", "eager",
                      "--distributions", "data,layer", "--network", "5,10,10"]],  # data: skips tiling 32
    "demo": [["demo", "--model", "gpt2-tiny", "--batch", "2", "--seq", "32", "--execute", "1", "--steps", "1",
              "--out", "{tmp}/demo"]],
    "tune --execute": [["tune", *TINY[:6], "--tiles", "32;64", "--scheds", "eager", "--worker-counts", "1",
                        "--execute", "1", "--steps", "1", "--warmup", "1", "--recalibrate", "--quiet-check",
                        "--out", "{tmp}/tune"]],
    "calibrate --check": [["calibrate", "--check"]],
    "accuracy": [["accuracy", "--suite", "quick", "--steps", "1", "--warmup", "1", "--worker-counts", "1",
                  "--scheds", "eager", "--no-quiet-check", "--recalibrate"]],
    "whatif": [["whatif", *LAYOUT, "--gpus", "64", "--tp", "8"],
               ["whatif", *LAYOUT, "--gpus", "64", "--tp", "8", "--sweep", "network_bw=1,2"]],
    "whatif --search": [["whatif", *LAYOUT, "--gpus", "64", "--search", "--top", "2", "--max-configs", "20",
                         "--baseline", "tp=8", "--sweep", "network_bw=1,2"]],
    "whatif --inference": [["whatif", *SERVE, "--tp", "2", "--batch", "4", "--sweep", "batch=1,2"]],
    "whatif --inference --search": [["whatif", *SERVE, "--gpus", "8", "--search", "--top", "2", "--baseline", "tp=8",
                                     "--sweep", "hbm_gb=80,141"]],
    "validate": [["validate"]],
}
# sections whose commands run on StarPU-MPI (mpirun, ~10 s a run): the test files that run them anyway check their
# keys (json_keys.assert_documented)
CHECKED_BY = {"run --ranks": "tests/test_mpi_run.py", "train --ranks": "tests/test_mpi_train.py",
              "calibrate --ranks": "tests/test_mpi_network.py"}


def test_every_command_has_its_json_documented_and_run():
    assert {s.split()[0] for s in JSON_RUNS} == set(COMMANDS)
    assert not set(JSON_RUNS) & set(CHECKED_BY)
    text = open(os.path.join(ROOT, "docs", "cli.md")).read()
    json_part = text[text.index("## `--json` keys"):]
    assert set(re.findall(r"^### (.+)$", json_part, re.M)) == set(JSON_RUNS) | set(CHECKED_BY)
    for section, test_file in CHECKED_BY.items():  # those tests check the section's keys on their own runs
        assert f'assert_documented("{section}"' in open(os.path.join(ROOT, test_file)).read(), (section, test_file)


def _json(capsys, argv) -> dict:
    import json

    from tilecast.cli import main

    status = main(argv + ["--json"])
    captured = capsys.readouterr()
    if status == 2 and "StarPU" in captured.err:
        pytest.skip(f"StarPU is not available here: {captured.err.strip()}")
    assert status in (0, 1), (argv, captured.err[-2000:])  # 1: a target missed; the object is still printed
    return json.loads(captured.out)


@pytest.fixture(scope="module")
def simulated_trace(tmp_path_factory):
    import tilecast as tc
    from tilecast.trace import save

    path = str(tmp_path_factory.mktemp("trace") / "pred.parquet")
    save(tc.simulate("gpt2-tiny", batch=2, seq=32, tile=32, machine="h100-sxm5-80gb-8").trace(), path)
    return path


# commands a section's runs need before them, their output not checked: --check reads the home's stored calibration
SETUP = {"calibrate --check": [["calibrate", *TINY, "--tiles", "32", "--repeats", "2", "--per-kernel", "2",
                                "--no-probe"]]}

# runs that store what they learn into the home's calibration: they run in a copy of it, which they may change
WRITES_CALIBRATION = {"tune --execute", "accuracy"}


@pytest.mark.parametrize("section", list(JSON_RUNS))  # in order: the runs on StarPU calibrate the home first
def test_json_keys_are_the_documented_ones(section, tmp_path, capsys, simulated_trace, loop_home,  # noqa: F811
                                           monkeypatch):
    """Every key a command prints, top-level or nested, is in docs/cli.md, and every key there is printed by one of
    the runs (tests/json_keys.py)."""
    if section in WRITES_CALIBRATION:
        import shutil

        shutil.copytree(loop_home, tmp_path / "home")
        monkeypatch.setenv("TILECAST_HOME", str(tmp_path / "home"))
    printed, objects = {}, []
    for argv in SETUP.get(section, []):
        _json(capsys, argv)
    for i, argv in enumerate(JSON_RUNS[section]):
        (tmp_path / str(i)).mkdir()
        argv = [a.format(tmp=tmp_path / str(i), trace=simulated_trace) for a in argv]
        objects.append(_json(capsys, argv))
        for key in objects[-1]:
            printed.setdefault(key, " ".join(argv))
    undocumented = sorted(set(printed) - set(json_keys.rows(section)))
    assert not undocumented, f"docs/cli.md does not document {section} --json keys {undocumented}: " + \
        "; ".join(f"{k} from `{printed[k]}`" for k in undocumented)
    json_keys.assert_documented(section, objects)


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
