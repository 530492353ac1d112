"""Validation loss on StarPU with the forward-only graph, reading the training step's parameters in place.

The forward graph (:func:`~tilecast.graph.models.build_forward`) declares
the parameters with the same tiles as the step graph, so its parameter tiles
are pointed at the training store's buffers: evaluating copies no weights and
sees exactly the parameters the last step left.
"""

from __future__ import annotations

import numpy as np

from tilecast.executor.step import step_loss
from tilecast.executor.tiles import TileStore
from tilecast.graph.models import build_forward, model_parameters


class Evaluator:
    """Mean validation loss of the parameters held in ``train_store`` over fixed batches."""

    def __init__(self, cfg, batch: int, seq: int, tiling, train_store: TileStore, batches):
        self.graph = build_forward(cfg, batch, seq, tiling)
        self.batches = list(batches)
        if not self.batches:
            raise ValueError("no validation batches (the validation data is shorter than one batch)")
        self.store = TileStore(self.graph)
        step_graph = train_store.graph
        for name in model_parameters(cfg):
            mine, theirs = self.graph.tensor(name), step_graph.tensor(name)
            if not np.array_equal(mine.tile_shapes(), theirs.tile_shapes()):
                raise ValueError(f"parameter {name!r} is tiled differently in the step and forward graphs")
            for i in range(mine.n_tiles):
                buf = train_store.buffers[theirs.first_tile + i]
                if buf is None:
                    raise ValueError(f"parameter {name!r} is not loaded in the training store")
                self.store.buffers[mine.first_tile + i] = buf
        self.tokens = len(self.batches) * batch * seq

    def loss(self, session) -> float:
        """Mean over the batches of each batch's mean cross-entropy (all batches have one shape)."""
        total = 0.0
        for ids, targets in self.batches:
            self.store.set_tensor("ids", ids)
            self.store.set_tensor("targets", targets)
            session.execute(self.graph, self.store, trace=False)
            total += step_loss(self.store)
        return total / len(self.batches)
