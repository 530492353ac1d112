"""The task-graph IR: tensors split into tiles, tasks over tiles, inferred dependencies.

The package is also the API's ``tc.graph(...)`` (:func:`tilecast.api.graph`): calling it builds and summarises
a training step's graph (see :class:`tilecast.EntryPointPackage`).
"""

import sys

from tilecast.graph.builder import GraphBuilder
from tilecast.graph.graph import Graph, TaskView
from tilecast.graph.tensor import Tensor
from tilecast.graph.tiling import DIMS, Tiling, TilingError

__all__ = ["DIMS", "Graph", "GraphBuilder", "TaskView", "Tensor", "Tiling", "TilingError"]

from tilecast import EntryPointPackage  # noqa: E402

sys.modules[__name__].__class__ = EntryPointPackage
