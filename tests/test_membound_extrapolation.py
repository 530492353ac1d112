"""Memory-bound kernels extrapolated past the caches their timed shapes fit in: the shape model takes the rate
of the predicted shape's cache regime (tilecast.perfmodel.cache_regimes), and calibration's design times a
shape beyond the last-level cache where none is. Synthetic timings with a cache cliff; nothing is timed."""

import numpy as np

from tilecast.kernels import get
from tilecast.perfmodel.cache_regimes import CacheRegimes, working_set
from tilecast.perfmodel.cache_size import last_level
from tilecast.perfmodel.calibration import Calibration, gemm_cases
from tilecast.perfmodel.calibration_design import PAST_CACHE, past_cache, scaled_case
from tilecast.perfmodel.shape_model import ShapeModel, extrapolation_errors

MIB = 2**20
L2, LLC = 1 * MIB, 32 * MIB
# The machine: memory streams 12 GB/s (its measured bandwidth); the kernel reaches 10 GB/s from memory, 40 GB/s
# within the last-level cache, 80 GB/s within the level-2 cache.
CACHES = CacheRegimes((float(L2), float(LLC)), memory_bps=12e9, balance=5.0)


def adamw(n):
    return np.array([n, 1e-3, 0.9, 0.95, 1e-8, 0.1, 1.0, 4 * n, 4 * n, 4 * n, 4 * n], dtype=np.float64)


def truth(rows):
    """AdamW's seconds with a cache cliff: 28 bytes moved per parameter at the rate of where its 16 live."""
    n = rows[:, 0]
    ws, moved = 16 * n, 28 * n
    rate = np.where(ws <= L2, 80e9, np.where(ws <= LLC, 40e9, 10e9))
    return 2e-6 + moved / rate


def sweep(top_mib, bottom_kib=64):
    """AdamW shapes whose buffers take 64 KiB, doubling, up to ``top_mib``."""
    out, ws = [], bottom_kib * 1024
    while ws <= top_mib * MIB:
        out.append(adamw(ws // 16))
        ws *= 2
    return np.asarray(out)


def rel_err(model, rows):
    return np.abs(model.predict(rows) - truth(rows)) / truth(rows)


def test_cache_regimes_classify_working_sets():
    k = get("adamw")
    ws = working_set(k.id, sweep(256))
    r = CACHES.regime(ws)
    assert (r[ws <= L2] == 0).all() and (r[(ws > L2) & (ws <= LLC)] == 1).all() and (r[ws > LLC] == 2).all()
    assert CACHES.memory == 2
    gemm = np.asarray([row for _, row in gemm_cases([512])])
    assert CACHES.memory_bound(k.id, sweep(1)).all() and not CACHES.memory_bound(get("gemm").id, gemm).any()
    embed = np.array([[256, 32000, 4096, 0, 0.0, 2048, 4 * 32000 * 4096, 4 * 256 * 4096]], dtype=np.float64)
    assert not CACHES.memory_bound(get("embed").id, embed).any()  # a gather: its bytes formula is a bound
    assert not CacheRegimes(CACHES.bounds).memory_bound(k.id, sweep(1)).any()  # no balance known: none taken


def test_timed_within_the_last_cache_extrapolated_beyond_it():
    """Timed up to 16 MiB of buffers (all within the last-level cache), predicted at 256 MiB and 1 GiB: without
    regimes the model carries the cache's rate and is 4x fast (75% off); with them, a shape beyond the last cache
    takes at least its bytes at the machine's memory bandwidth, 12 GB/s against the kernel's 10 (17% off)."""
    k = get("adamw")
    timed, far = sweep(16), np.asarray([adamw(16 * MIB), adamw(64 * MIB)])
    old = ShapeModel.fit(k.id, timed, truth(timed))
    new = ShapeModel.fit(k.id, timed, truth(timed), caches=CACHES)
    assert rel_err(old, far).min() > 0.6
    assert rel_err(new, far).max() < 0.2
    inside = sweep(16, bottom_kib=96)  # shapes between the timed ones: interpolated alike with or without
    assert np.allclose(new.predict(inside), old.predict(inside))


def test_timed_beyond_the_last_cache_takes_that_rate():
    """Two timed sizes beyond the last-level cache (64 and 128 MiB): a 1 GiB shape takes their rate alone
    (within 2%); without regimes, the nearest timed shapes inside the cache pull it fast."""
    k = get("adamw")
    timed, far = sweep(128), np.asarray([adamw(64 * MIB)])
    old = ShapeModel.fit(k.id, timed, truth(timed))
    new = ShapeModel.fit(k.id, timed, truth(timed), caches=CACHES)
    assert rel_err(new, far).max() < 0.02
    assert rel_err(old, far).max() > 2 * rel_err(new, far).max()


def test_the_memory_floor_comes_in_past_the_cache():
    """No floor within the last cache, half of it at 1.41x (half a doubling past it), whole from twice it on."""
    moved = np.full(4, 12e9)
    floor = CACHES.memory_seconds(moved, np.array([LLC / 2, LLC, np.sqrt(2) * LLC, 4 * LLC]))
    assert np.allclose(floor, [0.0, 0.0, 0.5, 1.0])


def test_compute_bound_and_sparse_kernels_are_left_as_they_were():
    gemm = get("gemm")
    rows = np.asarray([r for _, r in gemm_cases([32, 64, 128, 256])])
    t = 3e-6 + 2 * rows[:, 2] * rows[:, 3] * rows[:, 4] / 50e9
    far = np.asarray([r for _, r in gemm_cases([1024, 2048])])
    assert np.array_equal(ShapeModel.fit(gemm.id, rows, t, caches=CACHES).predict(far),
                          ShapeModel.fit(gemm.id, rows, t).predict(far))
    embed = get("embed")
    vts = 2.0 ** np.arange(5, 14)
    rows = np.asarray([[256, v, 512, 0, 0.0, 2048, 4 * v * 512, 4 * 256 * 512] for v in vts])
    t = np.full(len(rows), 1e-4)  # a gather of 256 rows costs the same whatever the tile it reads them from
    far = rows[-1:].copy()
    far[0, 1], far[0, 6] = 2**20, 4 * 2**20 * 512
    assert np.array_equal(ShapeModel.fit(embed.id, rows, t, caches=CACHES).predict(far),
                          ShapeModel.fit(embed.id, rows, t).predict(far))


def test_extrapolation_errors_with_regimes():
    """The held-out measure (the 2 largest sizes predicted from the smaller alone) on timings crossing the last
    cache at its top: 32 MiB is within it, 64 MiB beyond."""
    cal = Calibration("local", "x", "cpu", "fake", kernels="k")
    rows = sweep(64)
    for r, t in zip(rows, truth(rows)):
        cal.add("adamw", r, float(t), 0.0)
    before = extrapolation_errors(cal)["adamw"]
    after = extrapolation_errors(cal, caches=CACHES)["adamw"]
    assert before["n_heldout"] == after["n_heldout"] == 2
    assert before["max_rel_err"] > 0.5 and after["max_rel_err"] < 0.2


def test_design_times_a_shape_past_the_last_cache():
    """A memory-bound kernel with shapes over the bound beyond the last-level cache and none timed beyond it:
    its largest affordable shape beyond the cache is timed, else its largest scaled to PAST_CACHE times the
    cache; nothing is added where one is timed or known, nor for a compute-bound kernel."""
    small = [("adamw", r) for r in sweep(8)]
    huge = [("adamw", adamw(200e6)), ("gemm", np.array([0, 0, 8192, 8192, 8192, 1, 1, 4 * 8192**2, 4 * 8192**2,
                                                        4 * 8192**2], dtype=np.float64))]
    cases = small + huge
    over = [False] * len(small) + [True, True]
    timed = list(range(len(small)))
    add, made = past_cache(cases, over, timed, CACHES)
    assert add == [] and len(made) == 1 and made[0][0] == "adamw"
    ws = working_set(get("adamw").id, made[0][1][None])[0]
    assert abs(ws / (PAST_CACHE * LLC) - 1) < 0.01 and CACHES.regime(ws) == CACHES.memory
    # an affordable shape beyond the cache, not chosen by the design: it is timed instead of a new one
    mid = [("adamw", adamw(8 * MIB))]  # 128 MiB of buffers, clear of the cache (64 MiB would not be)
    add, made = past_cache(small + mid + huge, over[:len(small)] + [False, True, True], timed, CACHES)
    assert add == [len(small)] and made == []
    # one timed before (known), or chosen: nothing to add
    assert past_cache(cases, over, timed, CACHES, known={"adamw": [adamw(8 * MIB)]}) == ([], [])
    assert past_cache(cases, over, timed, CACHES, known={"adamw": [adamw(2 * MIB)]})[1]  # 32 MiB: not clear
    assert past_cache(small + mid + huge, over[:len(small)] + [False, True, True], timed + [len(small)],
                      CACHES) == ([], [])
    # a kernel whose buffers the registry does not tie to one size is not scaled
    assert scaled_case("gemm", huge[1][1], 2.0) is None and scaled_case("adamw", adamw(10), 3.0)[0] == 30


def test_last_level_cache_from_sysfs(tmp_path):
    for i, (level, kind, size, cpus) in enumerate([(1, "Data", "32K", "0"), (1, "Instruction", "32K", "0"),
                                                   (2, "Unified", "1024K", "0"), (3, "Unified", "32768K", "0-1")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", cpus)):
            (d / name).write_text(f"{value}\n")
    size, sharing, source = last_level(str(tmp_path))
    assert (size, sharing) == (32 * MIB, 2) and "level 3" in source
    assert last_level(str(tmp_path / "none"))[0] == 0
