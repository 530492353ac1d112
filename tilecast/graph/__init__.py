"""The task-graph IR: tensors split into tiles, tasks over tiles, inferred dependencies."""

from tilecast.graph.builder import GraphBuilder
from tilecast.graph.graph import Graph, TaskView
from tilecast.graph.tensor import Tensor
from tilecast.graph.tiling import DIMS, Tiling, TilingError

__all__ = ["DIMS", "Graph", "GraphBuilder", "TaskView", "Tensor", "Tiling", "TilingError"]
