"""The packages import one another only along the arrows of docs/design.md, imports inside functions included."""

import ast
from pathlib import Path

import tilecast

PACKAGE = Path(tilecast.__file__).parent
COMMON = {"home", "atomic_file", "errors"}  # every package may import these; they import nothing of tilecast
LOWER = {"graph", "perfmodel", "kernels", "trace"}
ALLOWED = {
    "graph": {"kernels", "__init__"},  # __init__: tilecast.EntryPointPackage, the graph package as tc.graph
    "kernels": set(),
    "perfmodel": {"kernels"},
    "simulator": LOWER,
    "cluster": LOWER | {"simulator"},
    "reference": {"graph", "kernels"},
    "data": set(),
    "executor": LOWER | {"reference", "data"},
    "training": LOWER | {"executor", "reference", "data"},
    "reports": {"trace"},
    "loop": LOWER | {"simulator", "executor", "reference", "reports"},
    "trace": set(),
    "home": set(),
    "atomic_file": set(),
    "errors": set(),
}
FREE = {"cli", "api", "__init__", "__main__"}  # cli and api may import everything; __init__ loads api lazily


def _imports(path: Path) -> set[str]:
    """The tilecast packages and top-level modules that ``path`` imports."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "tilecast":
                names = [f"tilecast.{a.name}" if (PACKAGE / a.name).is_dir() or (PACKAGE / f"{a.name}.py").exists()
                         else "tilecast.__init__" for a in node.names]
            else:
                names = [node.module]
        else:
            continue
        out |= {n.split(".")[1] for n in names if n.startswith("tilecast.")}
    return out


def _unit(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def test_every_package_and_module_has_its_arrows():
    units = {_unit(p) for p in PACKAGE.rglob("*.py")}
    assert units - FREE <= set(ALLOWED), f"add the arrows of {sorted(units - FREE - set(ALLOWED))} here and to docs/design.md"


def test_imports_follow_the_arrows():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        unit = _unit(path)
        for target in _imports(path) - {unit}:
            if target in {"cli", "api"} and unit not in {"__init__", "__main__", "cli", "api"}:
                wrong.append(f"{path.relative_to(PACKAGE)} imports {target}: nothing imports cli or api")
            elif unit not in FREE and target not in ALLOWED[unit] | COMMON:
                wrong.append(f"{path.relative_to(PACKAGE)} imports {target}")
    assert not wrong, "imports against docs/design.md's arrows:\n" + "\n".join(wrong)


def test_the_checker_sees_imports_inside_functions(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from tilecast.simulator.engine import Engine\n    import tilecast.executor.tiles\n")
    assert _imports(f) == {"simulator", "executor"}
