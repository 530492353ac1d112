"""One model description: the cluster what-if keeps no model-shape class of its own beside ModelConfig.

Its former ``Shape`` was retired for :class:`~tilecast.graph.model_config.ModelConfig`; this scan of the
package's source keeps a second one from coming back.
"""

import ast
from pathlib import Path

import tilecast.cluster

SHAPE_FIELDS = {"n_layer", "n_embd", "n_head", "n_kv_head", "intermediate_size", "vocab_size", "n_positions",
                "hidden_size", "num_layers", "num_hidden_layers", "num_attention_heads"}


def shape_classes(source: str) -> list[str]:
    """Classes holding two or more model-shape fields (class annotations or ``self.x =`` in a method)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        names = {t.target.id for t in node.body if isinstance(t, ast.AnnAssign) and isinstance(t.target, ast.Name)}
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) and \
                    isinstance(sub.value, ast.Name) and sub.value.id == "self":
                names.add(sub.attr)
        if len(names & SHAPE_FIELDS) >= 2:
            found.append(node.name)
    return found


def test_the_scan_finds_a_shape_class():
    assert shape_classes("class Shape:\n    n_layer: int\n    n_embd: int\n") == ["Shape"]
    assert shape_classes("class S:\n    def __init__(self, c):\n        self.hidden_size = c[0]\n"
                         "        self.num_layers = c[1]\n") == ["S"]
    assert shape_classes("class Strategy:\n    tp: int\n    pp: int\n") == []


def test_the_cluster_package_has_no_shape_class_of_its_own():
    root = Path(tilecast.cluster.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert len(files) > 10
    found = {str(f.relative_to(root)): c for f in files if (c := shape_classes(f.read_text()))}
    assert found == {}, f"model shapes outside ModelConfig: {found}"
