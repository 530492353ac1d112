"""The --json keys docs/cli.md documents, compared both ways with the objects commands print.

Each ``### section`` of docs/cli.md's "`--json` keys" holds a table: its first column the top-level keys, its
other cells name, in backticks, the keys of the objects under each (at any depth: objects in objects, lists of
objects). :func:`assert_documented` fails on a key printed, at the top or nested, that its row does not name, and
on a key or name documented that no object printed. tests/test_cli_vocabulary.py runs the commands for most
sections; the test files that run a command on StarPU-MPI anyway (tests/test_mpi_*.py) check theirs.
"""

import os
import re

from tilecast.cli import COMMANDS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Objects keyed by names (kernels, tensors, memory nodes, links, policies, swept parameters), not by fields: their
# names are not keys, the objects under them are checked. Paths: the top-level key, then a field, or "*" for the
# objects under names; a list's items keep the list's path.
NAMED = {
    "graph": {"kernels", "recompute_settings"},
    "verify": {"grads", "params", "float32_params"},
    "calibrate": {"heldout", "heldout_hot", "extrapolated"},
    "calibrate --ranks": {"protocol_s"},
    "simulate": {"peak_memory_bytes", "bytes_per_link"},
    "tune": {"ranking.peak_memory_bytes"},
    "tune --execute": {"ranking.peak_memory_bytes", "executed.peak_memory_bytes"},
    "whatif": {"sweeps"},
    "whatif --inference": {"sweeps"},
    "whatif --search": {"search_sweeps"},
    "whatif --inference --search": {"search_sweeps"},
    "validate": {"median_abs_error_lopo_by_source"},
    "accuracy": {"per_shape", "views", "views.*.per_shape", "rows.peak_memory_bytes"},
}
# (section, path) -> the section whose table documents the objects there ("section:key": that key's row); the row
# says so ("each as `whatif`'s object")
AS_SECTION = {
    ("simulate", "policies"): "simulate",
    ("whatif --search", "top"): "whatif",
    ("whatif --search", "baseline"): "whatif",
    ("whatif --inference --search", "top"): "whatif --inference",
    ("whatif --inference --search", "baseline"): "whatif --inference",
    ("demo", "executed"): "tune --execute:executed",
    ("demo", "best"): "tune --execute:executed",
}
# (section, key) -> names its row gives that the runs do not print, and why
UNPRINTED = {
    ("run", "predicted"): {"error": "only when the forecast fails"},
    ("compare", "files"): {"pred_chrome_json": "without --no-chrome", "real_chrome_json": "without --no-chrome"},
    ("whatif", "sweeps"): {"error": "only for a value the layout or the hardware cannot take"},
    ("whatif --inference", "sweeps"): {"error": "only for a value the layout or the hardware cannot take"},
    ("whatif --inference", "mode"): {"continuous": "a value, with --request-rate"},
    **{("calibrate", key): {k: "held-out errors need more shapes per kernel than --per-kernel 2 times (minutes)"
                            for k in ("n_fit", "n_heldout", "median_rel_err", "max_rel_err", "base_median_rel_err",
                                      "fit", "fixed_us", "gflops", "GBps")} for key in ("heldout", "heldout_hot")},
    ("calibrate --ranks", "probe"): {
        **{k: "submit_roles is null where too few insertions kept their core (load)"
           for k in ("exec", "other", "send", "recv", "drop", "deps")},
        **{k: "message_cpu_calls is null where a cost per call of the test's small probe fits below zero"
           for k in ("base_s", "per_test_s", "per_send_call_s", "per_recv_call_s", "call_cost_s", "gaps",
                     "send_calls_per_message", "recv_calls_per_message", "send_side_s", "recv_side_s",
                     "send_calls", "recv_calls", "runs")}},
    ("accuracy", "views"): {"note": "only where a view stands for another: a suite of one model shape"},
    ("accuracy", "conditions"): {
        **{k: "only when calibration was timed in the run (the test's home is calibrated already)"
           for k in ("calibration_passes", "passes", "disturbed", "retaken", "still_disturbed", "seconds",
                     "retaken_what")},
        "reference_note": "only when the reference steps of calibration and measurement differ by over 12%"},
    ("calibrate", "extrapolated"): {k: "no shape of a small step is over the bound"
                                    for k in ("n", "decades", "heldout")},
    ("calibrate", "disk"): {k: "fitted with --offload-dir on probe steps under a memory limit: minutes of StarPU runs"
                            for k in ("per_task", "allocs", "reads", "writebacks", "drops", "read_bytes",
                                      "writeback_bytes", "probe", "workers", "measured_step_s", "base_step_s",
                                      "predicted_step_s", "error")},
}


def rows(section: str) -> dict:
    """Key -> the rest of its row (unit and meaning), for every key in the first column of the table under
    docs/cli.md's ``### section``, and those of the section it extends ("The keys of `tune`, and:")."""
    text = open(os.path.join(ROOT, "docs", "cli.md")).read()
    found = re.search(rf"^### {re.escape(section)}\n(.*?)(?=^#)", text + "\n#", re.S | re.M)
    assert found, f"docs/cli.md has no section '### {section}'"
    base = re.search(r"^The keys of `([^`]+)`, and", found.group(1), re.M)
    out = rows(base.group(1)) if base else {}
    for first, rest in re.findall(r"^\|([^|\n]*)\|(.*)$", found.group(1), re.M):
        for key in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", first):
            out[key] = rest
    return out


def named_in(row: str) -> set:
    """The key names a row gives in backticks (`fit`, and both parts of `bound.max_task_s`); not a flag, a
    command line or a quoted value."""
    return {w for span in re.findall(r"`([^`]+)`", row) if not re.search(r"[\s'\"-]", span)
            for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span)}


def _walk(section, value, path, fields, words, refs, name=None):
    """Adds to ``fields`` (path -> keys) the keys of the objects in ``value`` at ``path``, to ``words`` every key,
    name and string printed, to ``refs`` (section -> objects) the objects another section documents. ``name``:
    the name the objects are under (a swept parameter's rows hold its value under its name: not a field)."""
    if isinstance(value, list):
        for v in value:
            _walk(section, v, path, fields, words, refs, name)
    elif isinstance(value, str):
        words.add(value)
    elif isinstance(value, dict):
        other = AS_SECTION.get((section, path))
        if other is not None:
            refs.setdefault(other, []).append(value)
            return
        named = path in NAMED.get(section, ())
        for k, v in value.items():
            words.add(k)
            if not named and k != name:
                fields.setdefault(path, set()).add(k)
            _walk(section, v, f"{path}.*" if named else f"{path}.{k}", fields, words, refs, k if named else None)


def undocumented(section: str, objects: list, words: set) -> list:
    """Keys of ``objects`` (printed by ``section``'s runs), at the top or nested, that their rows do not name;
    adds every key, name and string printed to ``words``."""
    if ":" in section:  # "tune --execute:executed": objects of one key of that section
        section, key = section.split(":")
        objects = [{key: o} for o in objects]
    documented, problems, fields, refs = rows(section), [], {}, {}
    for obj in objects:
        for key, value in obj.items():
            words.add(key)
            if key not in documented:
                problems.append(f"{key} (top level)")
                continue
            _walk(section, value, key, fields, words, refs)
    for path, keys in sorted(fields.items()):
        top = path.split(".")[0]
        problems += [f"{path}.{k}" for k in sorted(keys - named_in(documented[top]) - {top})]
    for other, objs in refs.items():
        problems += [f"{p} (as {other})" for p in undocumented(other, objs, words)]
    return problems


def assert_documented(section: str, objects: list, where: str = "", unrun: dict | None = None) -> None:
    """Every key the ``objects`` (all the runs of ``section``) print, top-level or nested, is named in its row of
    docs/cli.md, and every key and name the section's rows give is printed by one of them. ``unrun``: key -> why
    the runs print it null (its row's nested names then go unchecked; printed as anything else, it fails)."""
    unrun = unrun or {}
    for key in unrun:
        assert all(obj.get(key) is None for obj in objects), f"{section}: {key} is printed; check it ({unrun[key]})"
    words = set()
    problems = undocumented(section, objects, words)
    assert not problems, f"docs/cli.md's {section} does not document --json keys {problems} {where}"
    printed = {k for obj in objects for k in obj}
    documented = rows(section)
    gone = sorted(set(documented) - printed)
    assert not gone, f"docs/cli.md documents {section} --json keys no run printed: {gone}"
    unprinted = sorted(f"{key}: {name}" for key, row in documented.items() if key not in unrun
                       for name in named_in(row) - words - set(COMMANDS) - set(UNPRINTED.get((section, key), ())))
    assert not unprinted, f"docs/cli.md's {section} rows name keys no run printed: {unprinted}"
