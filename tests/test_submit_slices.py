"""The submitting thread taking its turns on a worker's core (tilecast/simulator/submit_slices.py): its release
times and the sharer's turns by hand, a chain run by hand in both loops, the C loop equal to the general one on
random graphs for every policy, and where predict() applies it."""

import numpy as np
import pytest
from sim_graphs import random_graph
from sim_machines import cpu_machine, two_device_machine
from test_sim_fused import TILE, _outcome, assert_same_outcome

from tilecast.graph import GraphBuilder, Tiling
from tilecast.loop.predict import with_submitting_thread
from tilecast.simulator import native
from tilecast.simulator.engine import Engine
from tilecast.simulator.simulate import POLICIES, simulate
from tilecast.simulator.submit_slices import SubmitSlices

MS = 1e-3
# 1 ms a task, turns of 4 ms, the sharer's first turn 2 ms
TURNS = SubmitSlices(workers=2, cpu_task_s=1 * MS, slice_s=4 * MS, first_s=2 * MS)


def test_release_times_follow_the_submitting_threads_turns():
    # alone until the 4th task (2 x workers): 1-4 ms; the sharer's first turn 4-6 ms; then its own turns of
    # 4 ms, every other one: 6-10, 14-18, 22-26
    at = TURNS.release_times(16) / MS
    assert at == pytest.approx([1, 2, 3, 4, 7, 8, 9, 10, 15, 16, 17, 18, 23, 24, 25, 26])
    assert TURNS.resume_at(16) == pytest.approx(4 * MS)
    # as many tasks as the workers wait for: all submitted before they resume, no turn taken
    assert TURNS.release_times(3) / MS == pytest.approx([1, 2, 3])


def test_the_sharer_runs_in_its_own_turns_and_the_others_throughout():
    resume, end = 4 * MS, 26 * MS

    def run(w, b, d):
        return tuple(x / MS for x in TURNS.run(w, b * MS, d * MS, resume, end))

    assert run(1, 0, 1) == pytest.approx((4, 5))  # paused until the resume
    assert run(0, 0, 1) == pytest.approx((4, 5))  # the sharer's first turn
    assert run(0, 4, 3) == pytest.approx((4, 11))  # 2 ms in its first turn, 1 ms in its next (10-14)
    assert run(1, 4, 3) == pytest.approx((4, 7))
    assert run(0, 6.5, 1) == pytest.approx((10, 11))  # begun in the submitting thread's turn: waits for its own
    assert run(0, 6.5, 20) == pytest.approx((10, 38))  # 10-14, 18-22, then from 26 (all submitted): 12 ms more
    assert run(0, 27, 1) == pytest.approx((27, 28))  # after the last task is submitted: its core again


def test_a_submission_done_within_the_escape_is_not_cut():
    escaping = SubmitSlices(2, 1 * MS, 4 * MS, 2 * MS, escape_s=5 * MS)
    # 8 tasks: 4 alone, then 4 ms on a core after the resume, within the 5 ms: one uninterrupted turn
    short = escaping.for_tasks(8)
    assert short.release_times(8) / MS == pytest.approx([1, 2, 3, 4, 5, 6, 7, 8])
    assert short.first_s == 0.0
    resume, end = 4 * MS, 8 * MS
    # the sharer waits for the submitting thread's last task, then keeps its core; the other worker runs
    assert tuple(x / MS for x in short.run(0, resume, 1 * MS, resume, end)) == pytest.approx((8, 9))
    assert tuple(x / MS for x in short.run(1, resume, 1 * MS, resume, end)) == pytest.approx((4, 5))
    # 16 tasks need 12 ms after the resume: cut, the turns as without the escape
    assert escaping.for_tasks(16) is escaping
    assert escaping.release_times(16) / MS == pytest.approx(TURNS.release_times(16) / MS)
    assert TURNS.for_tasks(8) is TURNS  # no escape: every submission past the resume is cut


def test_predict_lets_a_short_submission_escape_and_cuts_a_long_one():
    """With the turns predict() gives (a 4 ms tick on 2 cores: escape 2 ms), 212 tasks at 3 us of wall a task
    (0.3 ms on a core) are not cut: the first ones start at once, where the cut held both workers for 2 ms."""
    from tilecast.simulator.ranks_threads import tick_slice_s

    m = cpu_machine(2)
    m.meta["hardware"] = {"cores": 2}
    turns = with_submitting_thread(m.with_workers(2), m, 2, 3e-6).submit_slices
    assert turns.escape_s == pytest.approx(tick_slice_s(2) / 2)
    assert turns.for_tasks(212).release_times(212)[-1] == pytest.approx(212 * 1.5e-6)
    assert turns.for_tasks(20000).release_times(20000)[-1] > 2 * 20000 * 1.5e-6 - turns.slice_s


def _chain(n):
    b = GraphBuilder(Tiling.uniform(TILE))
    t = b.tensor("x", (TILE, TILE), ("seq", None), "param")
    for _ in range(n):
        b.add("axpy", [t.tile_ids(0, 0), t.tile_ids(0, 0)], dict(n=TILE * TILE, alpha=0.5))
    return b.build()


@pytest.mark.parametrize("loop", ["general", "c"])
def test_a_chain_on_one_worker_by_hand(loop, monkeypatch):
    """One worker on one core, 1 ms tasks in a chain, 1 ms to submit each: the worker resumes at 2 ms (2 tasks
    queued), runs tasks 0-1 in its first turn (2-4 ms), task 2 (submitted at 5 ms, in the submitting thread's
    turn 4-8) at 8 ms, tasks 3-5 after it, and tasks 6-9 (submitted 13-16 ms) from 16 ms, when it is done."""
    if loop == "c" and native.library() is None:
        pytest.skip("the C loop cannot be built here (cffi or cc missing)")
    monkeypatch.setattr(Engine, "native_loop", loop == "c")
    g = _chain(10)
    m = cpu_machine(1).with_submit_slices(SubmitSlices(1, 1 * MS, 4 * MS, 2 * MS))
    r = simulate(g, m, "eager", durations=np.full((1, g.n_tasks), 1 * MS))
    assert r.start / MS == pytest.approx([2, 3, 8, 9, 10, 11, 16, 17, 18, 19])
    assert r.makespan == pytest.approx(20 * MS)
    # with an escape of 10 ms the 8 ms of submission after the resume are not cut: the worker, whose core the
    # submitting thread keeps, starts once the last task is submitted (10 ms)
    m = cpu_machine(1).with_submit_slices(SubmitSlices(1, 1 * MS, 4 * MS, 2 * MS, escape_s=10 * MS))
    r = simulate(g, m, "eager", durations=np.full((1, g.n_tasks), 1 * MS))
    assert r.start / MS == pytest.approx(np.arange(10, 20))


@pytest.mark.parametrize("sched", list(POLICIES))
def test_the_c_loop_equals_the_general_loop_with_the_turns(sched):
    if native.library() is None:
        pytest.skip("the C loop cannot be built here (cffi or cc missing)")
    g = random_graph(np.random.default_rng(5), 1500, 40, TILE)
    m = two_device_machine(capacity_gib=64 * TILE * TILE * 4 / 2**30, n_devices=2, workers_per_device=2)
    d = np.random.default_rng(6).integers(1, 50, size=(len(m.kind_names), g.n_tasks)) * 1e-6
    free = simulate(g, m, sched, durations=d).makespan
    turns = SubmitSlices(len(m.workers), free / g.n_tasks, free / 8, free / 16, sharer=1)
    shared = m.with_submit_slices(turns)
    general = _outcome(g, shared, d, sched, True, fused=False)
    assert not isinstance(general, str), general
    assert_same_outcome(general, _outcome(g, shared, d, sched, True, fused=False, native=True))
    slower = simulate(g, shared, sched, durations=d).makespan
    assert slower > free  # tasks wait to be submitted, and the sharer for its turns


def test_predict_gives_the_turns_only_where_the_workers_leave_no_core():
    m = cpu_machine(2)
    m.meta["hardware"] = {"cores": 2}
    both = with_submitting_thread(m.with_workers(2), m, 2, 3e-6)
    assert both.submit_slices is not None and both.submit_task == 3e-6
    assert both.submit_slices.cpu_task_s == pytest.approx(1.5e-6)  # one turn in two
    assert both.submit_slices.first_s == pytest.approx(both.submit_slices.slice_s / 2)
    one = with_submitting_thread(m.with_workers(1), m, 1, 3e-6)
    assert one.submit_slices is None and one.submit_task == pytest.approx(3e-6)
    del m.meta["hardware"]
    assert with_submitting_thread(m.with_workers(2), m, 2, 3e-6).submit_slices is None  # cores unknown


def test_bad_turns_are_refused():
    with pytest.raises(ValueError, match="sharer"):
        SubmitSlices(2, 1e-6, 4e-3, 2e-3, sharer=2)
    with pytest.raises(ValueError, match="slice_s"):
        SubmitSlices(2, 1e-6, 0.0, 2e-3)
    with pytest.raises(ValueError, match="cpu_task_s"):
        SubmitSlices(2, float("nan"), 4e-3, 2e-3)
    with pytest.raises(ValueError, match="escape_s"):
        SubmitSlices(2, 1e-6, 4e-3, 2e-3, escape_s=-1.0)
    with pytest.raises(Exception, match="2 workers"):
        cpu_machine(3).with_submit_slices(TURNS)
