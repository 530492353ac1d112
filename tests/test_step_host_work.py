"""What a training loop does between steps: the batch is written in place, so no tile is registered again."""

import time

import numpy as np

from tilecast.executor.starpu_run import StarPUTraining, run_steps
from tilecast.executor.starpu_session import StarPUSession
from tilecast.reference.step import TrainState, init_gpt2_params
from tilecast.reference.tiles import TileStore
from tilecast.graph import Tiling
from tilecast.graph.gpt2 import build_gpt2_step
from tilecast.graph.model_config import load_model


def test_write_tensor_keeps_buffers_and_splits_like_set_tensor():
    g = build_gpt2_step(load_model("gpt2-tiny"), 4, 16, Tiling.parse("batch=3,seq=5"))  # uneven tiles
    a, b = TileStore(g), TileStore(g)
    ids = np.random.default_rng(0).integers(0, 256, size=(4, 16))
    a.write_tensor("ids", ids)  # nothing allocated yet: splits
    t = g.tensor("ids")
    before = a.buffers[t.first_tile:t.first_tile + t.n_tiles]
    ids2 = ids[::-1].copy()
    a.write_tensor("ids", ids2)
    b.set_tensor("ids", ids2)
    after = a.buffers[t.first_tile:t.first_tile + t.n_tiles]
    assert all(x is y for x, y in zip(before, after))
    assert all(np.array_equal(x, y) for x, y in zip(after, b.buffers[t.first_tile:t.first_tile + t.n_tiles]))
    np.testing.assert_array_equal(a.tensor("ids"), ids2)


def test_tiles_set_from_one_array_do_not_share_memory():
    # seq untiled: each tile is a contiguous run of the array, which a split could return as a view
    g = build_gpt2_step(load_model("gpt2-tiny"), 4, 16, Tiling.parse("batch=2"))
    store, zeros = TileStore(g), np.zeros((4, 16), dtype=np.int64)
    store.set_tensor("ids", zeros)
    store.set_tensor("targets", zeros)  # as a loop's first, empty batch
    ids = np.arange(64).reshape(4, 16)
    store.write_tensor("ids", ids)
    store.write_tensor("targets", ids + 1)
    np.testing.assert_array_equal(store.tensor("ids"), ids)
    np.testing.assert_array_equal(store.tensor("targets"), ids + 1)
    assert not zeros.any()


def tiny_training(session, seed):
    """gpt2-tiny, batch 2 x 16, tile 16, three steps' batches drawn from ``seed``: (graph, data, training)."""
    cfg = load_model("gpt2-tiny")
    g = build_gpt2_step(cfg, 2, 16, Tiling.parse("16"))
    data = np.random.default_rng(seed).integers(0, cfg.vocab_size, size=(3, 2, 17))
    return g, data, StarPUTraining(session, g, TrainState(init_gpt2_params(cfg, 0)), data)


def test_steps_after_the_first_register_no_tile():
    with StarPUSession("eager", 2) as s:
        g, data, tr = tiny_training(s, 1)
        tr.step(trace=False)
        assert s.tile_handles.last_registered == g.n_tiles
        for _ in range(2):
            tr.step(trace=False)
            assert s.tile_handles.last_registered == 0
        np.testing.assert_array_equal(tr.store.tensor("ids"), data[2, :, :-1])


# The fastest step's time against the fastest host interval (a step's time beyond its makespan), each over
# STEPS - 1 steps: a loaded machine preempts the Python thread between steps as it preempts the workers, and the
# least disturbed of several is the one to compare. Ten runs of the earlier check (median host time < half the
# median step over 5 steps) on the 2-core AMD EPYC at load average 10-11 (2026-12-01) gave ratios 0.07-0.61 and
# failed twice; quiet, the steps take 3.5 ms and their host time 0.3 ms. Host work that does not scale down with
# the step (tiles registered again, the batch copied through numpy) is in every step's host interval, the least
# disturbed one too. Up to TRIES sessions, apart, should a slow phase of the machine outlast one.
STEPS, TRIES = 12, 3


def test_host_time_is_reported_and_small_beside_the_step():
    for attempt in range(TRIES):
        if attempt:
            time.sleep(2.0)
        r = run_steps(load_model("gpt2-tiny"), 4, 32, Tiling.parse("32"), "eager", 2, STEPS)
        host, steps = np.subtract(r.step_s[1:], r.makespan_s[1:]), np.asarray(r.step_s[1:])
        assert (host >= 0).all() and r.host_s == float(np.median(host))
        ratio = host.min() / steps.min()
        print(f"host {np.round(host * 1e3, 2)} ms, steps {np.round(steps * 1e3, 2)} ms: fastest host / fastest step "
              f"{ratio:.3f} (median over median {r.host_s / r.median_step_s:.3f})")
        if ratio < 0.5:
            break
    assert ratio < 0.5  # a loose bound: benchmarks/host_time.py measures the target


# The executor's marks of a step, in the order a step passes them (perf_counter's clock; the glue's marks are
# StarPU's clock moved onto it, to within a microsecond).
MARK_ORDER = ("step_start", "batch_loaded", "entered", "submit_called", "origin", "first_start", "last_end",
              "last_callback", "woken", "wait_returned", "paused", "all_done", "done", "loss_read")


def test_step_marks_are_in_order_and_bound_the_step():
    with StarPUSession("eager", 2) as s:
        _, _, tr = tiny_training(s, 2)
        for _ in range(3):
            seconds, _, _ = tr.step(trace=False)
            m = tr.marks
            times = [m[k] for k in MARK_ORDER]
            late = [(a, b) for (a, ta), (b, tb) in zip(zip(MARK_ORDER, times), zip(MARK_ORDER[1:], times[1:]))
                    if tb < ta - 2e-6]
            assert not late, f"marks out of order: {late}"
            assert m["origin"] <= m["submit_loop_end"] <= m["submit_returned"] + 2e-6
            assert abs((m["done"] - m["step_start"]) - seconds) < 1e-9
            assert abs((m["last_end"] - m["origin"]) - s.last_makespan_s) < 2e-6
