"""Whole graphs on StarPU: results equal the numpy references, traces are complete and causal."""

import numpy as np
import pytest

from tilecast.executor.sample_graphs import reference_matmul_gelu, tiled_matmul_gelu
from tilecast.executor.starpu_session import StarPUSession
from tilecast.reference.tiles import TileStore
from tilecast.kernels import all_kernels
from tilecast.trace import validate


def check_trace(trace, graph, n_workers):
    """One row per task; start < end; existing workers; no task starts before its predecessors end."""
    validate(trace)
    assert len(trace) == graph.n_tasks
    assert (trace["task"].to_numpy() == np.arange(graph.n_tasks)).all()
    assert (trace["source"] == "real").all()
    names = np.array([k.name for k in all_kernels()])
    assert (trace["kernel"].to_numpy() == names[graph.kernel]).all()
    start, end = trace["start_s"].to_numpy(), trace["end_s"].to_numpy()
    assert np.isfinite(start).all() and (start >= 0).all() and (start < end).all()
    assert trace["worker"].between(0, n_workers - 1).all()
    ptr, pred = graph.dependencies
    succ = np.repeat(np.arange(graph.n_tasks), np.diff(ptr))
    assert len(pred) > 0
    late = start[succ] < end[pred]
    assert not late.any(), f"{late.sum()} tasks started before a predecessor ended"
    assert np.allclose(trace["flops"], graph.flops) and (trace["bytes"].to_numpy() == graph.bytes).all()


def sequential_reference(graph, store):
    """Run the graph task by task with the numpy references (a minimal reference executor)."""
    store.allocate_all()
    kernels = all_kernels()
    for i in range(graph.n_tasks):
        k = kernels[graph.kernel[i]]
        t = graph.task(i)
        k.reference(np, [store.buffers[j] for j in t.tiles], k.unpack(t.params.values()))


@pytest.fixture(scope="module", params=["eager", "dmda", "lws"])
def session(request):
    with StarPUSession(request.param, 2) as s:
        yield s


@pytest.mark.parametrize("tile", [16, 23])
def test_matmul_gelu_equals_numpy(session, tile):
    m, k, n = 70, 50, 45
    rng = np.random.default_rng(tile)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    g = tiled_matmul_gelu(m, k, n, tile)
    store = TileStore(g)
    store.set_tensor("a", a)
    store.set_tensor("b", b)
    ta = g.tensor("a")
    a_tiles = store.buffers[ta.first_tile:ta.first_tile + ta.n_tiles]
    trace = session.execute(g, store)
    want = reference_matmul_gelu(a, b)
    got = store.tensor("y")
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    # tiles were used in place: the store still holds the very arrays it was given
    assert all(x is y for x, y in zip(a_tiles, store.buffers[ta.first_tile:]))
    check_trace(trace, g, session.n_workers)
    assert set(trace["tag"]) == {"matmul", "gelu"}


def test_starpu_equals_sequential_reference_tile_by_tile(session):
    g = tiled_matmul_gelu(33, 64, 17, 8)
    rng = np.random.default_rng(1)
    inputs = {"a": rng.standard_normal((33, 64)).astype(np.float32),
              "b": rng.standard_normal((64, 17)).astype(np.float32)}
    ours, ref = TileStore(g), TileStore(g)
    for name, x in inputs.items():
        ours.set_tensor(name, x)
        ref.set_tensor(name, x)
    session.execute(g, ours)
    sequential_reference(g, ref)
    for name in ("c", "y"):
        want = ref.tensor(name)
        assert np.abs(ours.tensor(name) - want).max() <= 1e-5 * np.abs(want).max(), name


def test_dry_run_leaves_data_untouched_and_baseline_is_positive(session):
    g = tiled_matmul_gelu(32, 32, 32, 8)
    store = TileStore(g)
    store.allocate_all()
    for buf in store.buffers:
        buf[:] = 7.0
    trace = session.execute(g, store, dry=True)
    assert all((buf == 7.0).all() for buf in store.buffers)
    check_trace(trace, g, session.n_workers)
    assert session.baseline(g, store) > 0


def test_wrong_tile_buffer_is_refused(session):
    g = tiled_matmul_gelu(16, 16, 16, 8)
    store = TileStore(g)
    store.allocate_all()
    store.buffers[0] = np.zeros(3, dtype=np.float32)
    with pytest.raises(ValueError, match="tile 0 of tensor 'a'"):
        session.execute(g, store)


def test_submitting_paused_gives_the_same_results(session):
    g = tiled_matmul_gelu(40, 40, 40, 16)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((40, 40)).astype(np.float32)
    b = rng.standard_normal((40, 40)).astype(np.float32)
    store = TileStore(g)
    store.set_tensor("a", a)
    store.set_tensor("b", b)
    trace = session.execute(g, store, submit_paused=True)
    want = reference_matmul_gelu(a, b)
    assert np.abs(store.tensor("y") - want).max() <= 1e-5 * np.abs(want).max()
    check_trace(trace, g, session.n_workers)


def test_handles_persist_across_executions_and_follow_new_buffers(session):
    """A training loop re-executes on one store: unchanged tiles keep their handles, changed ones
    are re-registered, and in-place writes between executions are seen."""
    m = k = n = 48
    g = tiled_matmul_gelu(m, k, n, 16)
    rng = np.random.default_rng(9)
    store = TileStore(g)
    store.set_tensor("a", rng.standard_normal((m, k)).astype(np.float32))
    store.set_tensor("b", rng.standard_normal((k, n)).astype(np.float32))
    session.execute(g, store, trace=False)
    session.execute(g, store, trace=False)
    assert session.tile_handles.last_registered == 0
    ta, tb = g.tensor("a"), g.tensor("b")
    a2 = rng.standard_normal((m, k)).astype(np.float32)
    store.set_tensor("a", a2)  # new arrays for a's tiles
    b2 = rng.standard_normal((k, n)).astype(np.float32)
    for i, tile in enumerate(tb.split(b2)):  # b's tiles overwritten in place
        store.buffers[tb.first_tile + i][:] = tile
    assert session.execute(g, store, trace=False) is None
    assert session.tile_handles.last_registered == ta.n_tiles
    want = reference_matmul_gelu(a2, b2)
    assert np.abs(store.tensor("y") - want).max() <= 1e-5 * np.abs(want).max()
