"""The accuracy suite's configurations: model shapes, tilings, policies and worker counts.

The full suite has four model shapes that the project never tuned for, none
of them the quiet check's reference step (gpt2-tiny) or a calibration probe:

- ``gpt2-5h``: 2 layers, 240 wide, 5 heads (an odd count), vocabulary 3001,
  batch 6 x 100: every tiling leaves a smaller last tile somewhere;
- ``gpt2-4x128``: 4 layers, 128 wide, batch 8 x 64: 4,800-8,700 tasks a
  step, most of them tens of microseconds;
- ``gpt2-4x512``: 4 layers, 512 wide, batch 16 x 256: steps of 2-6 seconds
  dominated by GEMMs;
- ``llama-3x192``: a Llama (RMSNorm, SwiGLU, rotary embeddings, 6 query heads
  sharing 2 KV heads, untied head), 3 layers, 192 wide, batch 4 x 96.

Four tilings each of the GPT-2 shapes, two of the Llama, and every (policy,
worker count) pair in turn: each task graph runs under two policies, each
with one worker and with all of them (:func:`suite_configs`), so that the 56
configurations cover every policy the simulator offers several times.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tilecast.errors import FieldError
from tilecast.graph import Tiling
from tilecast.graph.model_config import from_dict
from tilecast.loop.config import StepConfig


@dataclass(frozen=True)
class SuiteShape:
    """One model shape of the suite with its batch, sequence length and tilings."""

    role: str  # what this shape stands for in the suite
    model: dict
    batch: int
    seq: int
    tilings: tuple


UNEVEN = SuiteShape("uneven tiles, odd head count",
                    {"name": "gpt2-5h", "n_layer": 2, "n_embd": 240, "n_head": 5, "vocab_size": 3001,
                     "n_positions": 256}, 6, 100, ("48", "64", "80", "embd=96,inner=96,vocab=96"))
MANY_SMALL = SuiteShape("thousands of tasks of tens of microseconds",
                        {"name": "gpt2-4x128", "n_layer": 4, "n_embd": 128, "n_head": 4, "vocab_size": 2048,
                         "n_positions": 256}, 8, 64,
                        ("32", "48", "batch=2,seq=32,embd=64,inner=64,vocab=256", "embd=32,inner=32,vocab=32"))
LONG = SuiteShape("steps of seconds, GEMM-bound",
                  {"name": "gpt2-4x512", "n_layer": 4, "n_embd": 512, "n_head": 8, "vocab_size": 8192,
                   "n_positions": 512}, 16, 256, ("128", "192", "256", "512"))
LLAMA = SuiteShape("a Llama: grouped-query attention, SwiGLU, RMSNorm, rotary embeddings",
                   {"name": "llama-3x192", "family": "llama", "n_layer": 3, "n_embd": 192, "n_head": 6,
                    "n_kv_head": 2, "intermediate_size": 512, "vocab_size": 2000, "n_positions": 256}, 4, 96,
                   ("64", "96"))
QUICK_A = SuiteShape("quick: a small model", {"name": "gpt2-1x64", "n_layer": 1, "n_embd": 64, "n_head": 2,
                                               "vocab_size": 512, "n_positions": 64}, 2, 32, ("32",))
QUICK_B = SuiteShape("quick: odd head count", {"name": "gpt2-1x96", "n_layer": 1, "n_embd": 96, "n_head": 3,
                                                "vocab_size": 500, "n_positions": 64}, 2, 24, ("48",))

# suite -> (shapes, policies a task graph runs under)
SUITES = {"full": ((UNEVEN, MANY_SMALL, LONG, LLAMA), 2), "quick": ((QUICK_A, QUICK_B), 1)}


def suite_policies() -> list:
    """Every policy the simulator offers that the StarPU here runs (all of them without StarPU)."""
    from tilecast.loop.tune import usable_scheds
    from tilecast.simulator.simulate import POLICIES

    return usable_scheds(list(POLICIES))


def suite_workers(workers=None) -> list:
    """Worker counts of the suite: 1 and every core StarPU can use (``workers``: a list to use instead)."""
    from tilecast.loop.tune import starpu_max_workers

    limit = starpu_max_workers()
    if workers is None:
        most = max(1, min(os.cpu_count() or 1, limit or 1))
        return sorted({1, most})
    workers = sorted(set(int(w) for w in workers))
    if not workers or workers[0] < 1:
        raise FieldError(f"workers must be positive counts, got {workers}")
    if limit is not None and workers[-1] > limit:  # told before anything is calibrated or measured
        raise FieldError(f"workers must be at most {limit} (StarPU's CPU workers here), got {workers[-1]}")
    return workers


def suite_configs(name: str = "full", workers=None, policies=None) -> list:
    """The suite's configurations, in a fixed order: shape by shape, tiling by tiling.

    The (policy, worker count) pairs are taken in turn, ``k`` consecutive pairs
    per task graph for ``k`` policies a graph runs under (each with every
    worker count), so every policy appears and every graph runs with one
    worker and with all.
    """
    if name not in SUITES:
        raise FieldError(f"suite must be one of {', '.join(SUITES)}, got {name!r}")
    shapes, per_graph = SUITES[name]
    counts = suite_workers(workers)
    policies = list(policies) if policies is not None else suite_policies()
    if not policies:
        raise FieldError("policies: no scheduling policy both simulated and offered by StarPU here")
    out = []
    g = 0
    for shape in shapes:
        cfg = from_dict(shape.model, name=shape.model["name"])
        for t in shape.tilings:
            for j in range(per_graph):
                sched = policies[(g * per_graph + j) % len(policies)]
                for w in counts:
                    out.append(StepConfig(cfg, shape.batch, shape.seq, Tiling.parse(t), sched, w))
            g += 1
    return out


def shape_of(config) -> str:
    """The name of a configuration's model shape (what held-out figures leave out together)."""
    return config.model.name
