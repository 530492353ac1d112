"""Library errors name fields, not command-line flags; the CLI maps fields to flags (docs/design.md)."""

import ast
import re
from pathlib import Path

import pytest

import tilecast
from tilecast.errors import FieldError

PACKAGE = Path(tilecast.__file__).parent
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]*")
# Advice to run a command (its whole command line), not a flag standing for a field
COMMAND_ADVICE = re.compile(r"(tilecast [a-z]+|-m tilecast\.[\w.]+) --")


def _strings(node) -> list[str]:
    """The literal text of a message: string constants, and the literal parts of f-strings."""
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _flag_worded(path: Path, root: Path = PACKAGE) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Raise) and node.exc is not None:
            texts = _strings(node.exc)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "log":
            texts = _strings(node)
        else:
            continue
        text = "".join(texts)
        if FLAG.search(text) and not COMMAND_ADVICE.search(text):
            found.append(f"{path.relative_to(root)}:{node.lineno}: {text[:80]!r}")
    return found


def test_library_errors_name_fields_not_flags():
    wrong = [w for p in sorted(PACKAGE.rglob("*.py")) if "cli" not in p.relative_to(PACKAGE).parts[:1]
             for w in _flag_worded(p)]
    assert not wrong, "library messages worded as flags:\n" + "\n".join(wrong)


def test_the_scan_sees_a_flag_in_an_f_string(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('def g(n):\n    raise ValueError(f"--workers must be at least 1, got {n}")\n')
    f.write_text(f.read_text() + 'def h():\n    raise RuntimeError("run tilecast calibrate --ranks 2 first")\n')
    assert len(_flag_worded(f, tmp_path)) == 1  # the flag-worded error, not the command to run


@pytest.mark.parametrize("message, field, detail", [
    ("ranks: the data distribution needs a batch tile per rank", "ranks", "the data distribution needs a batch tile per rank"),
    ("workers must be between 1 and 4, got 9", "workers", "workers must be between 1 and 4, got 9"),
    ("pp/virtual_stages: 3 stages", "pp/virtual_stages", "3 stages"),
    ("A sentence", "", "A sentence"),
])
def test_field_error_names_its_field(message, field, detail):
    e = FieldError(message)
    assert (e.field, e.detail) == (field, detail)


def test_distribution_errors_are_field_errors():
    from tilecast.graph.distribution import distribute
    from tilecast.graph.model_config import load_model
    from tilecast.graph.models import build_step
    from tilecast.graph.tiling import Tiling

    g = build_step(load_model("gpt2-tiny"), 1, 16, Tiling.parse("16"))
    with pytest.raises(FieldError) as e:
        distribute(g, 2, "data")
    assert e.value.field == "ranks"
    with pytest.raises(FieldError) as e:
        distribute(g, 2, "nonesuch")
    assert e.value.field == "distribution"
