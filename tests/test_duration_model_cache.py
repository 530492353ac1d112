"""Kernel models kept between predictions follow every change of the calibration they were made from."""

import numpy as np
from sim_graphs import gemm_chain_graph

from tilecast.kernels import all_kernels
from tilecast.perfmodel import kernel_model, load_machine
from tilecast.perfmodel.calibration import Calibration
from tilecast.perfmodel.shapes import graph_shapes, unique_rows


def _calibration(machine, scale=1.0):
    cal = Calibration(machine.name, machine.fingerprint(), "cpu", "fake")
    for n in (16, 32, 48, 64, 96):
        for beta in (0.0, 1.0):
            shape = [0, 0, n, n, n, 1.0, beta, 4 * n * n, 4 * n * n, 4 * n * n]
            cal.add("gemm", shape, scale * (1e-6 + 2 * n ** 3 / 1e10), 0.0)
    return cal


def _fresh(machine, cal, graph):
    kernel_model._FITTED.clear()
    kernel_model._POINTS.clear()
    return kernel_model.DurationModel(machine, cal).durations(graph)


def test_kept_models_follow_replaced_and_added_points():
    machine = load_machine("local")
    g = gemm_chain_graph(n_layers=2, tiles=3, tile=48)
    cal = _calibration(machine)
    first = kernel_model.DurationModel(machine, cal).durations(g)
    assert np.array_equal(kernel_model.DurationModel(machine, cal).durations(g), first)
    assert np.array_equal(first, _fresh(machine, cal, g))
    # a list replaced by one of the same length (as a test of the accuracy suite does)
    cal.points["gemm"]["median_s"] = [2 * t for t in cal.points["gemm"]["median_s"]]
    doubled = kernel_model.DurationModel(machine, cal).durations(g)
    np.testing.assert_allclose(doubled, 2 * first)
    assert np.array_equal(doubled, _fresh(machine, cal, g))
    # a point added: the shape of the graph's beta-0 tasks now measured at another time
    cal.add("gemm", [0, 0, 48, 48, 48, 1.0, 0.0, 4 * 48 * 48, 4 * 48 * 48, 4 * 48 * 48], 1.0, 0.0)
    added = kernel_model.DurationModel(machine, cal).durations(g)
    assert np.array_equal(added, _fresh(machine, cal, g))
    assert not np.array_equal(added, doubled)


def test_distinct_shapes_match_numpy_unique_over_rows():
    g = gemm_chain_graph(n_layers=2, tiles=3, tile=48)
    for ks in graph_shapes(g):
        assert np.array_equal(ks.shapes[ks.inverse], np.concatenate(
            [g.kernel_params(ks.kernel)[1],
             g.tile_nbytes[g.acc_tile[g.acc_ptr[ks.tasks][:, None] + np.arange(len(all_kernels()[ks.kernel].buffers))]]],
            axis=1))
    rng = np.random.default_rng(3)
    for rows, cols in ((1, 4), (7, 1), (300, 6)):
        m = rng.integers(0, 3, (rows, cols)) * 0.5
        shapes, inverse = unique_rows(m)
        expect, expect_inv = np.unique(m, axis=0, return_inverse=True)
        assert np.array_equal(shapes, expect) and np.array_equal(inverse, expect_inv.reshape(-1))


def test_bytes_formula_by_weights_equals_access_bytes_per_buffer():
    from tilecast.kernels.registry import access_bytes

    rng = np.random.default_rng(5)
    for k in all_kernels():
        nbytes = rng.integers(0, 1 << 30, (9, len(k.buffers))).astype(np.float64)
        modes = np.broadcast_to(np.asarray(k.modes, dtype=np.int8), nbytes.shape)
        assert np.array_equal(k.bytes(nbytes), access_bytes(nbytes, modes).sum(axis=1)), k.name
        assert np.array_equal(k.bytes(nbytes, modes), k.bytes(nbytes)), k.name


def test_roofline_of_the_shapes_without_a_figure_is_the_roofline_over_all():
    machine = load_machine("local")
    g = gemm_chain_graph(n_layers=2, tiles=3, tile=48)
    kind = machine.kind_names[0]
    bare = kernel_model.DurationModel(machine, None)
    for ks in graph_shapes(g):
        sec, how = bare.shape_seconds(kind, ks.kernel, ks.shapes)
        n = ks.n_params
        expect = machine.kinds[kind].roofline(kernel_model.shape_flops(ks.kernel, ks.shapes[:, :n]),
                                              kernel_model.shape_bytes(ks.kernel, ks.shapes[:, n:]))
        assert np.array_equal(sec, expect) and (how == 2).all()


def test_cache_regimes_read_sysfs_once_a_process(monkeypatch):
    from tilecast.perfmodel import cache_regimes, cache_size

    calls = []
    real = cache_size.last_level
    monkeypatch.setattr(cache_size, "last_level", lambda *a: calls.append(a) or real(*a))
    cache_regimes._sysfs.cache_clear()
    try:
        kind = load_machine("local").kinds["cpu"]
        first = cache_regimes.machine_regimes(kind)
        assert cache_regimes.machine_regimes(kind) == first and len(calls) == 1
        llc, sharing, _ = real()
        assert first.bounds[-1] == max(kind.cache_bytes or cache_size.l2_per_core()[0], llc)
    finally:
        cache_regimes._sysfs.cache_clear()


def test_a_prediction_imports_neither_pandas_nor_scipy_optimize():
    import subprocess
    import sys

    code = ("import sys\n"
            "from tilecast.graph.model_config import load_model\n"
            "from tilecast.graph import Tiling\n"
            "from tilecast.loop.config import StepConfig\n"
            "from tilecast.loop.predict import predict\n"
            "from tilecast.perfmodel import load_machine\n"
            "c = StepConfig(load_model('gpt2-tiny'), 2, 32, Tiling.parse('32'), 'dmda', 2)\n"
            "p = predict(c, load_machine('local'), None)\n"
            "print(p.makespan_s > 0, [m for m in ('pandas', 'scipy.optimize') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "[]"]


def test_one_sort_and_per_kernel_shapes_agree():
    from tilecast.graph import Tiling
    from tilecast.graph.model_config import load_model
    from tilecast.loop.config import StepConfig
    from tilecast.perfmodel.shapes import shapes_one_sort, shapes_per_kernel

    graphs = [gemm_chain_graph(n_layers=2, tiles=3, tile=48),
              StepConfig(load_model("gpt2-tiny"), 4, 64, Tiling.parse("16"), "dmda", 2).build()]
    for g in graphs:
        one, per = shapes_one_sort(g), shapes_per_kernel(g)
        assert [k.kernel for k in one] == [k.kernel for k in per] and len(one) > 0
        for a, b in zip(one, per):
            assert a.n_params == b.n_params and np.array_equal(a.tasks, b.tasks)
            assert np.array_equal(a.shapes, b.shapes) and a.shapes.dtype == b.shapes.dtype
            assert np.array_equal(a.inverse, b.inverse)
