"""How large a training step's graph is, from the model and the tiling alone, before it is built.

A cluster-scale model at a fine tile is millions of tasks (``gpt3-175b`` at
batch 4 x 256, tile 256: 7.4 million), which takes minutes and gigabytes to
build and simulate. :func:`step_tasks` counts the tasks of
:func:`tilecast.graph.models.build_step` in closed form: every operation of
the GPT-2 and Llama builders issues one task per point of a grid of tile
counts (batch, seq, embd, head, inner, vocab tiles; the causal attention over
the lower triangle of seq tile pairs), so a layer's count is a polynomial in
those counts and the step's is the layers' plus the embeddings', head's and
loss's. It is exact (``tests/test_size_estimate.py`` compares it with the
builder over GPT-2 and Llama shapes, uneven and size-1 tiles, grouped
queries, tied heads and the three recompute settings).

:func:`check_step_size` refuses, before anything is built, a step over
:data:`MAX_STEP_TASKS` tasks or whose estimated memory (measured bytes per
task, :data:`BYTES_PER_TASK`) exceeds the memory available here, with a
:class:`StepTooLarge` (a FieldError on ``tile``) that names the task count,
the memory and the finest uniform tile that would fit.
"""

from __future__ import annotations

from tilecast.errors import FieldError
from tilecast.graph.recompute import check_recompute
from tilecast.graph.tiling import DIMS, Tiling

# A step may have at most this many tasks in graph, simulate and tune: gpt2-xl at batch 8 x 1024 and tile 128
# (2.0 million tasks) is built and summarised in about 5 s; 5 million take tens of seconds and gigabytes to
# simulate.
MAX_STEP_TASKS = 5_000_000

# Peak memory of a command per task of its step, bytes (docs/graph.md#how-large-a-step-is). "build": the graph
# with its dependencies (docs/benchmarks.md: 256-318 B); "graph": tilecast graph (build, dependencies, live
# memory, critical path: 300 B measured with --no-compare, doubled for the recompute settings it compares);
# "simulate": the graph, task durations, one simulation and its trace (1,470-1,590 B measured).
# "kept": a graph that tune keeps with its durations while it simulates others (276 B measured, benchmarks.md).
BYTES_PER_TASK = {"build": 320, "graph": 600, "simulate": 1_700, "kept": 400}
# Memory a command needs besides its graph (Python, numpy, the simulator's library), bytes.
BASE_BYTES = 300 * 2**20
# Uniform tile sizes a refusal may suggest, finest first.
SUGGESTED_TILES = tuple(2**k for k in range(5, 17))


class StepTooLarge(FieldError):
    """A step too large to build or simulate here; the message starts with ``tile``."""


def _n(tiling: Tiling, dim: str, extent: int) -> int:
    """Number of tiles of a dimension of ``extent``."""
    return -(-extent // tiling.tile(dim, extent))


def step_tasks(cfg, batch: int, seq: int, tiling: Tiling | None = None, recompute: str = "none") -> int:
    """The number of tasks of ``build_step(cfg, batch, seq, tiling, recompute=recompute)``, without building it."""
    t = tiling or Tiling()
    check_recompute(recompute)
    nb, ns = _n(t, "batch", batch), _n(t, "seq", seq)
    ne, nh = _n(t, "embd", cfg.n_embd), _n(t, "head", cfg.n_head)
    ni, nv = _n(t, "inner", cfg.n_inner), _n(t, "vocab", cfg.vocab_size)
    T, A, P = nb * ns, nb * nh, ns * (ns + 1) // 2  # token tiles, (batch, head) tiles, causal seq tile pairs
    probs = A * (3 * P - 2)  # scores and softmax: one fused task on the first query tile, three on the others
    attention = probs + A * P
    attention_bwd = A * (ns + 5 * P)
    if cfg.family == "llama":
        # key/value head tiles are as many as query head tiles (whole groups); expanded and reduced when grouped
        kv = 2 if cfg.group_size != 1 else 0
        fwd = T * (4 * nh * ne + (2 + kv) * nh + 3 * ni * ne + ni + 6 * ne) + attention
        last = T * (ni * ne + ne)  # the down projection and residual add, which a full replay leaves out
        bwd = T * (6 * ni * ne + ni + 8 * nh * ne + (2 + kv) * nh + 6 * ne) + attention_bwd
        adamw = 4 * ne * nh + 3 * ne * ni + 2 * ne
        embed = T * ne * nv
        embed_bwd = T * ne * nv
        params = nv * ne + ne + (0 if cfg.tie_word_embeddings else nv * ne)
    else:
        fwd = T * (4 * nh * ne + 3 * nh + 2 * ni * ne + 2 * ni + 8 * ne) + attention
        last = T * (ni * ne + 2 * ne)  # the MLP's output projection, its bias and the residual add
        bwd = T * (4 * ni * ne + 2 * ni + 8 * nh * ne + 3 * nh + 8 * ne) + attention_bwd
        adamw = 4 * ne * nh + 3 * nh + 2 * ne * ni + ni + 6 * ne
        npos = _n(Tiling({"seq": t.tile("seq", seq)}), "seq", cfg.n_positions)  # position tiles follow seq's
        embed = T * ne * nv + T * ne
        embed_bwd = T * ne * nv + npos * ne + T * ne  # token gradient, position gradient zeroed then summed
        params = nv * ne + npos * ne + 2 * ne
    replay = {"none": 0, "selective": probs, "full": fwd - last}[recompute]
    head = 2 * T * ne + T * nv * ne + 2 * T * nv + T  # final norm, LM head, loss
    head_bwd = T * nv + 2 * T * ne * nv + 3 * T * ne
    return embed + cfg.n_layer * (fwd + bwd + adamw + replay) + head + head_bwd + embed_bwd + params


def available_memory() -> int:
    """Memory this process can still take now, bytes: MemAvailable of /proc/meminfo (where it cannot be read,
    the physical memory), less where the process's address space limit (``ulimit -v``) leaves less room."""
    import os
    import resource

    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")  # physical memory
    have = _proc_kib("/proc/meminfo", "MemAvailable:", have)
    cap = resource.getrlimit(resource.RLIMIT_AS)[0]
    if cap != resource.RLIM_INFINITY:
        have = min(have, max(cap - _proc_kib("/proc/self/status", "VmSize:", 0), 0))
    return have


def _proc_kib(path: str, key: str, default: int) -> int:
    """A "key: N kB" line of a /proc file, bytes; ``default`` where it cannot be read."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return default


def step_memory(tasks: int, use: str = "simulate") -> int:
    """Estimated peak memory, bytes, of a command of ``use`` (build, graph, simulate) on a step of ``tasks``."""
    return BASE_BYTES + BYTES_PER_TASK[use] * int(tasks)


def size_refusal(tasks: int, use: str, max_tasks: int | None = None, available: int | None = None) -> str | None:
    """Why a step of ``tasks`` cannot be handled here (over the task limit or the memory), or None."""
    limit = MAX_STEP_TASKS if max_tasks is None else max_tasks
    if tasks > limit:
        return (f"{tasks:,} tasks, over the {limit:,} a step may have here (it would need about "
                f"{_gb(step_memory(tasks, use))})")
    return memory_refusal(tasks, use, available)


def memory_refusal(tasks: int, use: str, available: int | None = None) -> str | None:
    """Why ``tasks`` tasks cannot be held here to ``use`` them (their memory over ``available``), or None."""
    need, have = step_memory(tasks, use), available_memory() if available is None else available
    if need > have:
        return f"{tasks:,} tasks, which need about {_gb(need)} to {use} and {_gb(have)} is available"
    return None


def fitting_tile(cfg, batch: int, seq: int, recompute: str = "none", use: str = "simulate",
                 max_tasks: int | None = None, available: int | None = None) -> tuple[Tiling, int] | None:
    """(the finest uniform power-of-two tiling whose step fits, its task count), or None."""
    have = available_memory() if available is None else available
    for size in SUGGESTED_TILES:
        t = Tiling.uniform(size)
        if cfg.family == "llama" and t.tile("head", cfg.n_head) % cfg.group_size:
            continue  # a head tile would split a group of query heads
        n = step_tasks(cfg, batch, seq, t, recompute)
        if size_refusal(n, use, max_tasks, have) is None:
            return t, n
    return None


def check_step_size(cfg, batch: int, seq: int, tiling: Tiling | None, recompute: str = "none",
                    use: str = "simulate", max_tasks: int | None = None, available: int | None = None) -> int:
    """The step's task count; StepTooLarge (on ``tile``) when it is over ``max_tasks`` (default
    :data:`MAX_STEP_TASKS`) or its memory to ``use`` it is over ``available`` (default: what is available
    now), naming the finest uniform tile that fits."""
    t = tiling or Tiling()
    n = step_tasks(cfg, batch, seq, t, recompute)
    have = available_memory() if available is None else available
    why = size_refusal(n, use, max_tasks, have)
    if why is None:
        return n
    fit = fitting_tile(cfg, batch, seq, recompute, use, max_tasks, have)
    raise StepTooLarge(f"tile: {cfg.name} at batch {batch} x {seq}, tile {tile_label(t)}, is a step of {why}"
                       f" (estimated without building it); " + fit_hint(fit))


def fit_hint(fit) -> str:
    """What :func:`fitting_tile` found, in words."""
    if fit is None:
        return "no uniform tile makes it fit: a smaller model, batch or sequence"
    return f"tile {tile_label(fit[0])} gives {fit[1]:,} tasks"


def tile_label(t: Tiling) -> str:
    """``256`` for a uniform tiling, else its description."""
    sizes = {t.sizes.get(d) for d in DIMS}
    return str(sizes.pop()) if len(sizes) == 1 and None not in sizes else t.describe()


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"
