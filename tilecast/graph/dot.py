"""Graphviz DOT picture of a small task graph."""

from __future__ import annotations

from tilecast.graph.graph import Graph
from tilecast.kernels import all_kernels

MAX_DOT_TASKS = 2000
_PHASE_COLOURS = {"fwd": "#9ecae1", "bwd": "#fdae6b", "recompute": "#bcbddc", "adamw": "#a1d99b", "loss": "#fc9272"}


def to_dot(graph: Graph) -> str:
    """One node per task (kernel and id, coloured by phase), one edge per dependency."""
    if graph.n_tasks > MAX_DOT_TASKS:
        raise ValueError(f"the graph has {graph.n_tasks} tasks; a picture is drawn for at most {MAX_DOT_TASKS}")
    names = [k.name for k in all_kernels()]
    lines = ["digraph tilecast {", "  rankdir=TB;", '  node [shape=box, style=filled, fontname="Helvetica"];']
    for i in range(graph.n_tasks):
        tag = graph.tags[graph.tag[i]]
        colour = next((c for key, c in _PHASE_COLOURS.items() if key in tag), "#dddddd")
        lines.append(f'  t{i} [label="{names[graph.kernel[i]]}\\n#{i} {tag}", fillcolor="{colour}"];')
    ptr, pred = graph.dependencies
    for i in range(graph.n_tasks):
        for p in pred[ptr[i]:ptr[i + 1]].tolist():
            lines.append(f"  t{p} -> t{i};")
    lines.append("}")
    return "\n".join(lines) + "\n"
