"""Validation loss on StarPU with the forward-only graph, reading the training step's parameters in place.

The forward graph (:func:`~tilecast.graph.models.build_forward`) declares
the parameters with the same tiles as the step graph, so its parameter tiles
are pointed at the training store's buffers (or, for StarPU-managed tiles, at
the same StarPU handles): evaluating copies no weights and sees exactly the
parameters the last step left.
"""

from __future__ import annotations

import numpy as np

from tilecast.reference.step import step_loss
from tilecast.reference.tiles import TileStore
from tilecast.graph.models import build_forward, model_parameters


class Evaluator:
    """Mean validation loss of the parameters held in ``train_store`` over fixed batches."""

    def __init__(self, cfg, batch: int, seq: int, tiling, train_store: TileStore, batches, graph=None):
        self.graph = build_forward(cfg, batch, seq, tiling) if graph is None else graph
        self.batches = list(batches)
        if not self.batches:
            raise ValueError("no validation batches (the validation data is shorter than one batch)")
        step_graph = train_store.graph
        if hasattr(train_store, "share_tensor"):  # StarPU-managed tiles: share the parameters' handles
            from tilecast.executor.managed_tiles import ManagedTileStore

            self.store = ManagedTileStore(self.graph, train_store.session)
            for name in model_parameters(cfg):
                self.store.share_tensor(name, train_store)
            self.tokens = len(self.batches) * batch * seq
            return
        self.store = TileStore(self.graph)
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
