"""DAG helpers for the simulator: successors (:mod:`tilecast.graph.deps`) and bottom levels
(:mod:`tilecast.graph.priorities`), defined in the graph package so that the executor shares them.

Tasks are in submission order, so every predecessor has a smaller id and one
pass in id order (or its reverse) is a topological sweep. The sweeps are plain
Python over lists (about 0.5 us per task): a level-by-level numpy version pays
per level, and training-step graphs have thousands of levels. Earliest finishes
come from the graph package (``longest_path_end``), which the critical path of
``tilecast graph`` uses too.
"""

from __future__ import annotations

from tilecast.graph.deps import successors  # noqa: F401  (re-exported: one definition)
from tilecast.graph.priorities import bottom_level  # noqa: F401  (one definition, shared with the executor)
