"""Hot and cold lane times interpolated by reuse distance: distances, the cache size, DurationModel, old files."""

import json

import numpy as np
import pytest
import yaml

from sim_machines import KIND, fig
from tilecast.cli import main
from tilecast.graph import Tiling
from tilecast.graph.builder import GraphBuilder
from tilecast.graph.gpt2 import build_gpt2_step
from tilecast.graph.model_config import load_model
from tilecast.perfmodel import parse_machine
from tilecast.perfmodel.cache_size import FALLBACK_L2_BYTES, cpu_list_count, l2_per_core, parse_size
from tilecast.perfmodel.calibration import CALIBRATION_FORMAT, STARPU_TASKS, TRACE, Calibration, CalibrationError
from tilecast.perfmodel.kernel_model import DurationModel
from tilecast.perfmodel.reuse import cold_fraction, interpolate, reuse_distances

# gemm buffers (a, b, c) of these many float32s: bytes 4000, 8000, 12000, 16000, 20000
SIZES = {"A": 1000, "B": 2000, "C": 3000, "D": 4000, "E": 5000}
GEMM = {"trans_a": 0, "trans_b": 0, "m": 10, "n": 10, "k": 10, "alpha": 1.0, "beta": 1.0}


def small_graph(calls):
    """A graph of gemm tasks over named one-tile tensors of :data:`SIZES` floats, in the order of ``calls``."""
    b = GraphBuilder(Tiling())
    tiles = {n: b.tensor(n, (s,), (None,), "input").first_tile for n, s in SIZES.items()}
    for a, bb, c in calls:
        b.add("gemm", [tiles[a], tiles[bb], tiles[c]], GEMM)
    return b.build()


def test_reuse_distance_counts_the_bytes_since_the_tiles_last_access():
    g = small_graph([("A", "B", "C"), ("A", "D", "E"), ("B", "C", "A")])
    d = reuse_distances(g)
    # accesses: A B C | A D E | B C A; bytes 4k 8k 12k | 4k 16k 20k | 8k 12k 4k
    inf = np.inf
    assert d.tolist() == [inf, inf, inf,
                          4000 + 8000 + 12000, inf, inf,
                          8000 + 12000 + 4000 + 16000 + 20000, 12000 + 4000 + 16000 + 20000 + 8000,
                          4000 + 16000 + 20000 + 8000 + 12000]
    # first touches are cold; the second task's A (24 kB) is hot within 30 kB, the third task's tiles (60 kB
    # each) only within at least 60 kB (a distance equal to the cache is hot)
    assert cold_fraction(g, 30_000).tolist() == [1.0, 36000 / 40000, 1.0]
    assert cold_fraction(g, 59_999).tolist() == [1.0, 36000 / 40000, 1.0]
    assert cold_fraction(g, 60_000).tolist() == [1.0, 36000 / 40000, 0.0]
    with pytest.raises(ValueError, match="cache_bytes"):
        cold_fraction(g, 0)


def test_vectorised_distances_equal_a_plain_walk_over_a_step():
    g = build_gpt2_step(load_model("gpt2-tiny"), 2, 32, Tiling.parse("16"))
    nb = g.tile_nbytes[g.acc_tile].astype(np.float64)
    before = np.cumsum(nb) - nb
    last, want = {}, np.full(len(nb), np.inf)
    for i, t in enumerate(g.acc_tile.tolist()):
        if t in last:
            want[i] = before[i] - before[last[t]]
        last[t] = i
    assert np.array_equal(reuse_distances(g), want)
    # computed once per graph and cache size (tune predicts a graph on many policies), read-only
    f = cold_fraction(g, 1 << 20)
    assert cold_fraction(g, 1 << 20) is f and not f.flags.writeable and cold_fraction(g, 2 << 20) is not f


def test_cache_size_from_sysfs_and_its_fallback(tmp_path):
    assert parse_size("2048K") == 2 << 20 and parse_size("1M") == 1 << 20 and cpu_list_count("0-3,8") == 5
    for i, (level, kind, size, cpus) in enumerate([(1, "Data", "48K", "0"), (2, "Unified", "2048K", "0-1")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        for name, v in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", cpus)):
            (d / name).write_text(f"{v}\n")
    size, source = l2_per_core(str(tmp_path))
    assert size == 1 << 20 and "shared by 2 CPUs" in source  # 2 MiB shared by two cores
    assert l2_per_core(str(tmp_path / "none"))[0] == FALLBACK_L2_BYTES


def _machine(cache_kib=None):
    kind = dict(KIND)
    if cache_kib is not None:
        kind["l2_per_core_KiB"] = fig(cache_kib)
    return parse_machine({"format": 1, "name": "test-cache", "runtime": {"task_overhead_us": fig(0.0)},
                          "memory_nodes": [{"name": "host", "kind": "ram", "capacity_GiB": fig(64)}],
                          "worker_kinds": {"cpu": kind},
                          "workers": [{"name": "cpu", "kind": "cpu", "count": 1, "memory_node": "host"}]},
                         where="test")


SHAPE = [0, 0, 10, 10, 10, 1.0, 1.0, 4000, 8000, 12000]


def _calibration(machine, cold=3e-3, hot=1e-3, source=STARPU_TASKS, cache=1e6):
    cal = Calibration(machine.name, machine.fingerprint(), "cpu", STARPU_TASKS, cache_bytes=cache,
                      cache_source="test")
    cal.add("gemm", SHAPE, cold, 0.0, source)
    cal.add_hot("gemm", SHAPE, hot)
    return cal


def test_a_task_with_every_byte_cold_takes_the_cold_time_and_one_with_none_the_hot():
    m = _machine()
    g = small_graph([("A", "B", "C"), ("A", "B", "C"), ("A", "B", "C")])  # first touch, then reused at 24 kB
    d = DurationModel(m, _calibration(m, cache=1e6)).durations(g)[0]
    assert d.tolist() == [3e-3, 1e-3, 1e-3]
    # a cache smaller than the distance leaves every byte cold; the machine's stated cache wins over the
    # calibration's
    assert DurationModel(m, _calibration(m, cache=1000)).durations(g)[0].tolist() == [3e-3] * 3
    small = _machine(cache_kib=1)
    assert DurationModel(small, _calibration(small, cache=1e6)).durations(g)[0].tolist() == [3e-3] * 3
    # between: the cold share of the bytes
    g2 = small_graph([("A", "B", "C"), ("A", "D", "E")])
    cal = _calibration(m)
    cal.add("gemm", [0, 0, 10, 10, 10, 1.0, 1.0, 4000, 16000, 20000], 6e-3, 0.0)
    cal.add_hot("gemm", [0, 0, 10, 10, 10, 1.0, 1.0, 4000, 16000, 20000], 2e-3)
    assert DurationModel(m, cal).durations(g2)[0] == pytest.approx([3e-3, 2e-3 + 0.9 * 4e-3])
    assert interpolate([1.0], [3.0], [0.25]).tolist() == [1.5]


def test_durations_learned_from_traces_are_not_interpolated():
    m = _machine()
    g = small_graph([("A", "B", "C"), ("A", "B", "C")])
    cal = _calibration(m)
    cal.add("gemm", SHAPE, 2e-3, 0.0, TRACE)  # in-step already: the same for every task
    d = DurationModel(m, cal).durations(g)
    assert d[0].tolist() == [2e-3, 2e-3]
    # nor by a worker's cache state in a simulation (tilecast.simulator.worker_cache): one figure, delta 0
    from tilecast.perfmodel.task_lanes import lanes_of
    from tilecast.simulator.simulate import simulate

    assert lanes_of(d) is not None and not lanes_of(d).delta.any()
    r = simulate(g, m, "eager", durations=d)  # the second task finds its tiles hot: still 2 ms
    assert (r.end - r.start).tolist() == [2e-3, 2e-3]
    # a calibration without hot times (e.g. timed alone) keeps one figure per shape
    plain = Calibration(m.name, m.fingerprint(), "cpu", "c-kernels")
    plain.add("gemm", SHAPE, 5e-3, 0.0)
    assert DurationModel(m, plain).durations(g)[0].tolist() == [5e-3, 5e-3]


def test_calibration_keeps_hot_times_and_the_cache_and_refuses_the_old_format(tmp_path):
    m = _machine()
    cal = _calibration(m)
    back = Calibration.load(cal.save(str(tmp_path / "c.json")))
    assert back.hot == cal.hot and back.cache_bytes == 1e6 and back.arrays("gemm", lane="hot")[1].tolist() == [1e-3]
    assert back.calibrated_only().hot == cal.hot
    doc = json.loads((tmp_path / "c.json").read_text())
    doc["format"] = 3
    (tmp_path / "old.json").write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match="run `tilecast calibrate` again"):
        Calibration.load(str(tmp_path / "old.json"))
    doc["format"] = CALIBRATION_FORMAT
    doc["hot"]["gemm"]["median_s"] = [-1.0]
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match="field hot.gemm"):
        Calibration.load(str(tmp_path / "bad.json"))


def test_simulate_says_in_one_line_that_an_old_calibration_must_be_made_again(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    from sim_machines import KIND as kind
    from tilecast.perfmodel import load_machine

    doc = {"format": 1, "name": "test-old-cal", "runtime": {"task_overhead_us": fig(1.0)},
           "memory_nodes": [{"name": "host", "kind": "ram", "capacity_GiB": fig(64)}],
           "worker_kinds": {"cpu": kind},
           "workers": [{"name": "cpu", "kind": "cpu", "count": 1, "memory_node": "host"}]}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(doc))
    m = load_machine(str(path))
    stored = _calibration(m).save()
    old = json.loads(open(stored).read())
    old["format"] = 3
    open(stored, "w").write(json.dumps(old))
    small = ["simulate", "--model", "gpt2-tiny", "--batch", "1", "--seq", "16", "--tile", "16", "--no-trace",
             "--machine", str(path)]
    assert main([*small, "--calibration", stored]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].count("--calibration") == 1 and "run `tilecast calibrate` again" in err[0]
    assert main([*small, "--json"]) == 0  # the stored one: said once, then the roofline
    out = capsys.readouterr()
    assert json.loads(out.out)["calibration"].startswith("none")
    note = [line for line in out.err.splitlines() if "tilecast calibrate" in line]
    assert len(note) == 1 and "format 3" in note[0]


def test_learning_from_a_trace_keeps_the_hot_times_and_the_cache():
    from tilecast.perfmodel.from_trace import calibration_from_trace
    from tilecast.trace import make_trace

    m = _machine()
    g = small_graph([("A", "B", "C"), ("A", "D", "E")])
    base = _calibration(m)
    start = np.array([0.0, 1e-3])
    trace = make_trace(task=np.arange(2), kernel="gemm", worker=0, node=0, start_s=start, end_s=start + 1e-3,
                       bytes=0, flops=0.0, source="real", tag="")
    cal = calibration_from_trace(g, trace, m, base=base)
    assert cal.hot == base.hot and cal.cache_bytes == base.cache_bytes
    # the traced shapes are in-step: one figure each, whatever their hot time
    assert DurationModel(m, cal).durations(g)[0].tolist() == pytest.approx([1e-3, 1e-3])


def test_the_shape_models_held_out_error_is_given_for_hot_and_cold_lane_times():
    from tilecast.loop.kernel_calibration import design_summary
    from tilecast.perfmodel.shape_model import holdout_errors

    m = _machine()
    cal = Calibration(m.name, m.fingerprint(), "cpu", STARPU_TASKS)
    for n in (8, 12, 16, 24, 32, 48, 64, 96):
        shape = [0, 0, n, n, n, 1.0, 1.0, 4 * n * n, 4 * n * n, 4 * n * n]
        cal.add("gemm", shape, 3e-9 * n**3 + 2e-6, 0.0)
        cal.add_hot("gemm", shape, 2e-9 * n**3 + 1e-6)
    cold, hot = holdout_errors(cal), holdout_errors(cal, lane="hot")
    assert cold["gemm"]["n_heldout"] == hot["gemm"]["n_heldout"] > 0
    assert cold["gemm"]["fit"] != hot["gemm"]["fit"]  # each lane its own model
    text = design_summary({"timed": 8, "cases": 10, "predicted": 2, "budget_s": 1.0, "wall_s": 1.0,
                           "heldout": cold, "heldout_hot": hot})
    assert text.count("gemm") == 2 and "hot lane times" in text
