"""A training step's state and the moving of it in and out of a graph's tiles.

Every executor runs a step the same way: load parameters, AdamW states and the
batch into a :class:`TileStore`, execute the graph, read back the loss,
gradients and updated states.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tilecast.reference.tiles import TileStore
from tilecast.graph import Graph
from tilecast.graph.gpt2 import adam_names, gpt2_parameters, grad_name
from tilecast.graph.model_config import ModelConfig


@dataclass
class TrainState:
    """Parameters and AdamW moments, keyed by tilecast parameter name; ``step`` steps done."""

    params: dict[str, np.ndarray]
    m: dict[str, np.ndarray] = field(default_factory=dict)
    v: dict[str, np.ndarray] = field(default_factory=dict)
    step: int = 0

    def __post_init__(self):
        for name, p in self.params.items():
            self.m.setdefault(name, np.zeros_like(p))
            self.v.setdefault(name, np.zeros_like(p))


@dataclass
class StepResult:
    loss: float
    grads: dict[str, np.ndarray]


def init_gpt2_params(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """GPT-2's initialisation as transformers does it: N(0, 0.02) weights and embeddings,
    zero biases, unit LayerNorm gains, and N(0, 0.02 / sqrt(2 n_layer)) for the
    projections that feed the residual stream (Radford et al. 2019, section 2.3)."""
    return dict(iter_gpt2_params(cfg, seed))


#: elements drawn at a time by :func:`normal32` (its float64 draw: 8 MiB)
DRAW_CHUNK = 1 << 20


def normal32(rng, std: float, shape) -> np.ndarray:
    """``rng.normal(0, std, shape).astype(np.float32)``, the same values, drawn a chunk at a time: the float64
    draw of a whole tensor (8 bytes per element, beside the 4 of the result) is what a memory-limited run held
    beyond its limit while it loaded its largest tensors (docs/memory.md)."""
    out = np.empty(int(np.prod(shape)), dtype=np.float32)
    for i in range(0, out.size, DRAW_CHUNK):
        out[i:i + DRAW_CHUNK] = rng.normal(0.0, std, min(DRAW_CHUNK, out.size - i))
    return out.reshape(shape)


def iter_gpt2_params(cfg: ModelConfig, seed: int = 0):
    """(name, array) of :func:`init_gpt2_params`, one parameter at a time (the same values)."""
    rng = np.random.default_rng(seed)
    residual_std = 0.02 / np.sqrt(2 * cfg.n_layer)
    for name, (shape, _) in gpt2_parameters(cfg).items():
        leaf = name.rsplit(".", 1)[-1]
        if name.endswith(("ln_1.g", "ln_2.g", "ln_f.g")):
            a = np.ones(shape, dtype=np.float32)
        elif leaf in ("b", "bq", "bk", "bv", "bo", "bfc", "bproj"):
            a = np.zeros(shape, dtype=np.float32)
        else:
            a = normal32(rng, residual_std if leaf in ("wo", "wproj") else 0.02, shape)
        yield name, a


def init_llama_params(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """A Llama's initialisation as transformers does it: N(0, 0.02) weights and embeddings, unit RMSNorm gains."""
    return dict(iter_llama_params(cfg, seed))


def iter_llama_params(cfg: ModelConfig, seed: int = 0):
    """(name, array) of :func:`init_llama_params`, one parameter at a time."""
    from tilecast.graph.llama import llama_parameters

    rng = np.random.default_rng(seed)
    for name, (shape, _) in llama_parameters(cfg).items():
        yield name, np.ones(shape, dtype=np.float32) if name.endswith("norm.g") else normal32(rng, 0.02, shape)


def init_params(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """The initial parameters of ``cfg``'s family."""
    return dict(iter_params(cfg, seed))


def iter_params(cfg: ModelConfig, seed: int = 0):
    """The initial parameters of ``cfg``'s family, one at a time: a model larger than memory is loaded
    into StarPU-managed tiles without ever holding all its parameters in numpy."""
    from tilecast.graph.model_config import ModelConfigError

    err = cfg.numeric_error()
    if err:
        raise ModelConfigError(err)
    return iter_llama_params(cfg, seed) if cfg.family == "llama" else iter_gpt2_params(cfg, seed)


def load_initial(graph: Graph, cfg: ModelConfig, seed: int, ids, targets, store: TileStore) -> TileStore:
    """:func:`load_step` of ``TrainState(init_params(cfg, seed))`` into ``store``, one parameter at a time
    (zero AdamW moments): the tiles receive the same values."""
    for name, p in iter_params(cfg, seed):
        store.set_tensor(name, p)
        zeros = np.zeros(p.shape, dtype=p.dtype)
        del p
        for moment in adam_names(name):
            store.set_tensor(moment, zeros)
    set_batch(graph, store, ids, targets, 1)
    return store


def set_batch(graph: Graph, store: TileStore, ids, targets, step: int) -> None:
    """Put a batch into a store and set AdamW's (1-based) step number: what changes between steps."""
    graph.set_param("adamw", "step", step)
    store.write_tensor("ids", np.asarray(ids, dtype=np.int64))  # in place: StarPU's handles stay valid
    store.write_tensor("targets", np.asarray(targets, dtype=np.int64))


def restore_built_step(graph: Graph) -> None:
    """AdamW's step number back to the 1 a built graph holds, once steps have run on ``graph``.

    The number does not change a task's duration, but task shapes are keyed
    by every parameter: kernel models learned from a run's traces would
    otherwise hold AdamW shapes that no built graph asks about.
    """
    graph.set_param("adamw", "step", 1)


def step_loss(store: TileStore) -> float:
    """The loss a step left in its store."""
    return float(store.tensor("loss")[0])


def load_step(graph: Graph, state: TrainState, ids: np.ndarray, targets: np.ndarray,
              store: TileStore | None = None) -> TileStore:
    """A store holding the step's inputs (a new in-place TileStore, or ``store``, e.g. a
    ManagedTileStore); sets AdamW's step number on the graph."""
    store = TileStore(graph) if store is None else store
    for name, p in state.params.items():
        store.set_tensor(name, p)
        m_name, v_name = adam_names(name)
        store.set_tensor(m_name, state.m[name])
        store.set_tensor(v_name, state.v[name])
    set_batch(graph, store, ids, targets, state.step + 1)
    return store


def finish_step(graph: Graph, store: TileStore, state: TrainState, want_grads: bool = True) -> StepResult:
    """Read the loss, gradients and updated states back; advances ``state.step``."""
    grads = {}
    for name in state.params:
        state.params[name] = store.tensor(name)
        m_name, v_name = adam_names(name)
        state.m[name] = store.tensor(m_name)
        state.v[name] = store.tensor(v_name)
        if want_grads:
            grads[name] = store.tensor(grad_name(name))
    state.step += 1
    return StepResult(loss=step_loss(store), grads=grads)


def reference_step(graph: Graph, state: TrainState, ids, targets, want_grads: bool = True) -> StepResult:
    """One training step with the sequential numpy reference executor."""
    from tilecast.reference.run import run_reference

    store = load_step(graph, state, ids, targets)
    run_reference(graph, store)
    return finish_step(graph, store, state, want_grads)
