"""Kernel shapes timed as StarPU tasks (lanes of chained tasks, every worker busy) and stored as such."""

import numpy as np
import pytest

from tilecast.executor.runtime_timer import chain_order_weights, lanes_graph, runnable, time_in_runtime
from tilecast.executor.starpu_session import StarPUSession
from tilecast.graph import Tiling
from tilecast.graph.gpt2 import build_gpt2_step
from tilecast.graph.model_config import load_model
from tilecast.perfmodel.calibration import STARPU_TASKS, cases_from_shapes
from tilecast.perfmodel.shapes import graph_shapes


def _cases():
    g = build_gpt2_step(load_model("gpt2-tiny"), 2, 32, Tiling.parse("32"))
    return cases_from_shapes(graph_shapes(g), per_kernel=2)


def test_lanes_are_independent_chains():
    cases = _cases()[:5]
    reps = [3, 2, 4, 2, 3]
    g, contents, task_case, first = lanes_graph(cases, range(5), reps, lanes=2)
    assert g.n_tasks == 2 * sum(reps) == len(task_case)
    assert len(contents) == g.n_tiles and all(c.nbytes == n for c, n in zip(contents, g.tile_nbytes))
    assert first.sum() == 2 * len(cases)
    pred_ptr, pred = g.dependencies
    for t in range(g.n_tasks):
        preds = pred[pred_ptr[t]:pred_ptr[t + 1]]
        assert all(task_case[p] == task_case[t] for p in preds)  # no dependency across shapes
        if first[t]:
            assert len(preds) == 0
        else:  # the previous task of the same lane: two positions back in a case's block (2 lanes)
            assert list(preds) == [t - 2]


def _case_switches(sched):
    """Per worker, how often its next task belongs to another shape than its last one."""
    from tilecast.reference.tiles import TileStore

    cases = _cases()[:12]
    reps = [6] * len(cases)
    g, contents, task_case, _ = lanes_graph(cases, range(len(cases)), reps, lanes=2)
    store = TileStore(g)
    store.buffers = contents
    with StarPUSession(sched, 2) as s:
        w = chain_order_weights(task_case, list(range(len(cases))), 2) if sched == "prio" else None
        tr = s.execute(g, store, trace=True, priority=w)
    tr = tr[tr["task"] >= 0].sort_values("start_s")
    out = []
    for _, rows in tr.groupby("worker"):
        c = task_case[rows["task"].to_numpy()]
        out.append(int((c[1:] != c[:-1]).sum()))
    return len(cases), out


def test_chain_order_weights_rank_cases_first_to_last():
    from tilecast.graph.priorities import bottom_level

    cases = _cases()[:4]
    g, _, task_case, _ = lanes_graph(cases, range(4), [3, 5, 2, 4], lanes=2)
    bl = bottom_level(chain_order_weights(task_case, [0, 1, 2, 3], 2), *g.dependencies)
    for c in range(3):  # every task of a case ranks above every task of the next
        assert bl[task_case == c].min() > bl[task_case == c + 1].max()


def test_prio_lanes_run_each_shape_back_to_back():
    # under eager every chain's first task is ready at once and the shapes interleave (each repeat cold);
    # under prio with the chain order, a worker moves to the next shape about once per shape
    n, prio = _case_switches("prio")
    _, eager = _case_switches("eager")
    print(f"shape switches per worker of {n} shapes: prio {prio}, eager {eager}")
    assert max(prio) <= 2 * n, prio
    assert max(eager) > 2 * n, eager  # one worker at least interleaves (how the two share them depends on timing)


def test_time_in_runtime_gives_each_shape_its_tasks_durations():
    cases = _cases()
    # a GEMM of 32 times the flops of the step's largest: at a few microseconds the step's own two GEMM shapes
    # differ by less than a task's floor varies (on the Intel Xeon guest 3.92 us for the larger, 4.22 the smaller)
    big = 2 * 128 * 128 * 256
    cases.append(("gemm", np.array([0, 0, 128, 128, 256, 1.0, 0.0, 4 * 128 * 256, 4 * 256 * 128, 4 * 128 * 128],
                                   dtype=np.float64)))
    cases.append(("gemm", np.array([0, 0, 0, 8, 8, 1.0, 0.0, 0, 256, 0], dtype=np.float64)))  # empty buffers
    assert not runnable(*cases[-1])
    done = []
    gemm = [i for i, (n, _) in enumerate(cases[:-1]) if n == "gemm"]
    repeats = [9 if i in gemm else 3 for i in range(len(cases))]  # tasks of microseconds: a median of 9 for the order
    with StarPUSession("eager", 2) as s:
        med, mad = time_in_runtime(cases, repeats, s, progress=done.append)
    assert np.isnan(med[-1]) and np.isfinite(med[:-1]).all() and (med[:-1] > 0).all()
    assert (mad[:-1] >= 0).all() and sum(done) == len(cases) - 1
    flops = [2 * cases[i][1][2] * cases[i][1][3] * cases[i][1][4] for i in gemm]
    assert max(flops) == big
    print(f"gemm of {max(flops):.0f} flops: {med[gemm[int(np.argmax(flops))]] * 1e6:.2f} us, "
          f"of {min(flops):.0f}: {med[gemm[int(np.argmin(flops))]] * 1e6:.2f} us")
    assert med[gemm[int(np.argmax(flops))]] > med[gemm[int(np.argmin(flops))]]  # more work takes longer


def test_calibration_on_first_use_times_shapes_as_starpu_tasks(tmp_path, monkeypatch):
    from tilecast.loop.kernel_calibration import WORKER_SAMPLES_PER_KERNEL, ensure_calibration, missing_cases
    from tilecast.loop.step_probe import BYTE_RANGE, FACTOR_RANGE, HOT_RANGE, in_step_line, probe_graph
    from tilecast.executor.starpu_session import max_workers
    from tilecast.perfmodel import load_machine

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    g = build_gpt2_step(load_model("gpt2-tiny"), 1, 16, Tiling.parse("16"))
    machine = load_machine("local")
    cal = ensure_calibration(machine, [g], progress=False)
    sources = {src for name in cal.points for src in cal.sources(name)}
    assert sources == {STARPU_TASKS}
    assert not missing_cases(cal, [g])
    # the step probe's shapes were timed too, and the probe step ran against them (tilecast.loop.step_probe)
    assert not missing_cases(cal, [probe_graph()])
    # and fitted, both factors within their ranges
    assert cal.in_step_source.startswith("measured: gpt2-step-probe"), cal.in_step_source
    assert FACTOR_RANGE[0] <= cal.in_step_factor <= FACTOR_RANGE[1] and HOT_RANGE[0] <= cal.in_step_hot <= HOT_RANGE[1]
    assert BYTE_RANGE[0] <= cal.in_step_byte_s <= BYTE_RANGE[1]
    print(in_step_line(cal))
    # a sample of each kernel's shapes also timed on one worker, when calibration kept several busy
    assert cal.lane_workers == min(len(machine.workers), max_workers())
    if cal.lane_workers > 1:
        assert 0 < len(cal.worker_samples["gemm"]) <= WORKER_SAMPLES_PER_KERNEL
        assert all(b > 0 and t1 > 0 and tw > 0 for b, t1, tw in cal.worker_samples["gemm"])
    else:
        assert cal.worker_samples == {}
    monkeypatch.setenv("TILECAST_HOME", str(tmp_path / "isolated"))
    alone = ensure_calibration(machine, [g], progress=False, in_runtime=False)
    assert {src for name in alone.points for src in alone.sources(name)} == {"c-kernels"}


@pytest.mark.parametrize("workers", [1, 2])
def test_lanes_follow_the_worker_count(workers):
    cases = _cases()[:3]
    with StarPUSession("eager", workers) as s:
        med, _ = time_in_runtime(cases, [2, 2, 2], s)
    assert np.isfinite(med).all()


def test_a_timing_pass_in_a_slow_spell_is_retaken(tmp_path, monkeypatch):
    """The calibration's passes run between reference probes: a pass that ends in a slow spell is timed again,
    and the calibration keeps how its passes fared."""
    from tilecast.loop.interference import QuietGuard
    from tilecast.loop.kernel_calibration import HOT_PASSES, NEAR_PASSES, STARPU_PASSES, time_in_starpu
    from tilecast.perfmodel import load_machine

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    probes = iter([1.0, 1.0, 1.5] + [1.0] * 20)  # the first pass ends in a spell (1.5x the fastest probe)
    guard = QuietGuard(workers=1, probe=lambda: next(probes), sleep=lambda s: None, max_wait_s=10)
    cases = _cases()[:3]
    cal, _ = time_in_starpu(load_machine("local"), None, cases, [2, 2, 2], 1, guard=guard)
    assert cal.quiet["passes"] == STARPU_PASSES + HOT_PASSES + NEAR_PASSES and cal.quiet["passes_retaken"] == 1
    assert cal.quiet["passes_disturbed"] == 0  # the retaken pass was quiet
    assert set(cal.points) == {n for n, _ in cases}
    # every shape timed both cold (the points) and hot, with the cache size beside them
    assert set(cal.hot) == set(cal.points) and cal.cache_bytes > 0
    for name in cal.points:
        shapes, cold = cal.arrays(name)
        hshapes, hot = cal.arrays(name, lane="hot")
        assert np.array_equal(shapes, hshapes) and np.all(hot > 0) and len(cal.hot[name]["shapes"]) == len(cold)
    path = cal.save(str(tmp_path / "c.json"))
    back = type(cal).load(path)
    assert back.quiet == cal.quiet and back.hot == cal.hot and back.cache_bytes == cal.cache_bytes


def test_warmup_case_is_the_smallest_of_the_first_cases_kernel():
    from tilecast.executor.runtime_timer import WARMUP_BYTES, WARMUP_TASKS, warmup_case

    def gemm(m):  # m x m x m, its three buffers
        return ("gemm", np.array([0, 0, m, m, m, 1.0, 0.0] + [4.0 * m * m] * 3))

    fill = ("fill", np.array([16, 0.0, 64.0]))  # fewer bytes than any GEMM, but another kernel
    cases = [gemm(64), fill, gemm(32), gemm(512)]
    i, tasks = warmup_case(cases, [0, 1, 2, 3], [40, 40, 40, 4])
    assert i == 2 and tasks == WARMUP_TASKS  # 12 KiB a task: WARMUP_BYTES // 12288 = 341, capped
    i, tasks = warmup_case(cases, [3, 1], [40, 40, 40, 4])
    assert WARMUP_BYTES // (3 * 4 * 512 * 512) < 2 and (i, tasks) == (3, 4)  # 3 MiB a task: its own 4 repeats
    i, tasks = warmup_case(cases, [3, 1], [40, 40, 40, 1])
    assert (i, tasks) == (3, 2)  # at least 2
    i, tasks = warmup_case(cases, [1, 0], [40, 60, 40, 4])
    assert i == 1 and tasks == WARMUP_TASKS
    assert warmup_case(cases, [1, 0], [40, 500, 40, 4]) == (1, 500)  # never fewer than its own repeats


@pytest.mark.parametrize("sched", ["prio", "eager"])
def test_a_hot_graph_opens_with_an_untimed_chain(sched):
    """Under a priority policy every graph starts with the warm-up chain (its tasks the highest priorities, run
    first and not timed); under eager no chain is added."""
    from tilecast.executor.runtime_timer import warmup_case

    cases = [c for c in _cases() if c[0] == "gemm"][:2] + [c for c in _cases() if c[0] != "gemm"][:2]
    reps = [3, 4, 3, 2]
    seen = []
    with StarPUSession(sched, 2) as s:
        run = s.execute

        def spy(graph, store, **kw):
            tr = run(graph, store, **kw)
            seen.append((graph.n_tasks, tr))
            return tr

        s.execute = spy
        med, _ = time_in_runtime(cases, reps, s)
    assert np.isfinite(med).all() and len(seen) == 1
    n_tasks, tr = seen[0]
    if sched == "eager":
        assert n_tasks == 2 * sum(reps)
        return
    w, w_tasks = warmup_case(cases, range(4), reps)
    assert cases[w][0] == "gemm" and n_tasks == 2 * (sum(reps) + w_tasks)
    first = tr[tr["task"] >= 0].sort_values("start_s")["task"].to_numpy()[:2]
    assert (first < 2 * w_tasks).all(), first  # lanes_graph puts the chain first: its tasks are 0 .. 2 w_tasks - 1
