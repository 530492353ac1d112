"""simulate_streams: in-order streams on the simulator's engine, checked against hand-computed times."""

import numpy as np
import pytest

from tilecast.simulator import simulate_streams


def csr(preds):
    ptr = np.zeros(len(preds) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(p) for p in preds])
    flat = np.array([x for p in preds for x in p], dtype=np.int32)
    return ptr, flat


def test_chain_on_one_stream_is_the_sum_of_durations():
    d = np.array([1.0, 2.0, 0.5])
    start, end = simulate_streams(d, np.zeros(3, int), *csr([[], [0], [1]]), n_streams=1)
    np.testing.assert_allclose(start, [0.0, 1.0, 3.0])
    np.testing.assert_allclose(end, [1.0, 3.0, 3.5])


def test_chain_across_streams_waits_for_predecessors():
    d = np.array([1.0, 2.0, 0.5])
    start, end = simulate_streams(d, np.array([0, 1, 0]), *csr([[], [0], [1]]), n_streams=2)
    np.testing.assert_allclose(end, [1.0, 3.0, 3.5])


def test_fork_join():
    # 0 forks into 1 (stream 0) and 2 (stream 1); 3 joins on stream 0.
    d = np.array([1.0, 2.0, 4.0, 1.0])
    start, end = simulate_streams(d, np.array([0, 0, 1, 0]), *csr([[], [0], [0], [1, 2]]), n_streams=2)
    np.testing.assert_allclose(start, [0.0, 1.0, 1.0, 5.0])
    np.testing.assert_allclose(end, [1.0, 3.0, 5.0, 6.0])


def test_two_independent_streams_overlap():
    d = np.array([3.0, 1.0, 2.0, 2.0])
    start, end = simulate_streams(d, np.array([0, 1, 0, 1]), *csr([[], [], [], []]), n_streams=2)
    np.testing.assert_allclose(start, [0.0, 0.0, 3.0, 1.0])
    assert end.max() == pytest.approx(5.0)  # not 8: the streams ran side by side


def test_in_order_head_of_line_blocking():
    # Stream 0 holds [1, 2]; task 1 waits for task 0 on stream 1, so task 2 (ready at once) waits too.
    d = np.array([5.0, 1.0, 1.0])
    start, end = simulate_streams(d, np.array([1, 0, 0]), *csr([[], [0], []]), n_streams=2)
    np.testing.assert_allclose(start, [0.0, 5.0, 6.0])


def test_communication_stream_overlaps_compute():
    # compute c0 -> comm m0 (stream 1) -> compute c2 needs m0; c1 is independent and fills the gap.
    d = np.array([1.0, 3.0, 2.0, 1.0])
    stream = np.array([0, 1, 0, 0])
    start, end = simulate_streams(d, stream, *csr([[], [0], [], [1, 2]]), n_streams=2)
    np.testing.assert_allclose(start, [0.0, 1.0, 1.0, 4.0])
    np.testing.assert_allclose(end, [1.0, 4.0, 3.0, 5.0])


@pytest.mark.parametrize("bad, message", [
    (dict(stream=np.array([0, 2])), "workers outside"),
    (dict(duration=np.array([1.0, -1.0])), "duration"),
    (dict(pred_ptr=np.array([0, 1, 1]), pred=np.array([1], np.int32)), "earlier task"),
    (dict(n_streams=0), "n_streams"),
])
def test_bad_inputs_are_rejected_with_a_message(bad, message):
    args = dict(duration=np.ones(2), stream=np.array([0, 1]), pred_ptr=np.array([0, 0, 1]),
                pred=np.array([0], np.int32), n_streams=2)
    args.update(bad)
    with pytest.raises(ValueError, match=message):
        simulate_streams(**args)


def test_large_random_streams_respect_order_and_dependencies():
    rng = np.random.default_rng(0)
    n, k = 2000, 4
    preds = [sorted(set(rng.integers(0, i, size=min(i, 2)).tolist())) if i else [] for i in range(n)]
    ptr, pred = csr(preds)
    d = rng.uniform(0.1, 1.0, n)
    stream = rng.integers(0, k, n)
    start, end = simulate_streams(d, stream, ptr, pred, k)
    np.testing.assert_allclose(end - start, d)
    for i, p in enumerate(preds):
        assert all(end[j] <= start[i] + 1e-12 for j in p)
    for s in range(k):
        ids = np.flatnonzero(stream == s)
        assert np.all(start[ids[1:]] >= end[ids[:-1]] - 1e-12)
        # no idle gap on a stream unless the task was waiting for a predecessor
        for a, b in zip(ids[:-1], ids[1:]):
            ready = max([end[j] for j in preds[b]], default=0.0)
            assert start[b] == pytest.approx(max(end[a], ready))
