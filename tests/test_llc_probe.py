"""The shared cache's share per core: the knee of a stream's rate, and the smaller of it and sysfs's figure."""

import numpy as np

from tilecast.perfmodel import llc_probe
from tilecast.perfmodel.llc_probe import effective_llc_per_core, footprints, knee, measure

MIB = 1 << 20


def test_footprints_run_from_four_level_2_caches_to_twice_the_sysfs_share():
    f = footprints(2 * MIB, 240 * MIB)
    assert f[0] == 8 * MIB and f[-1] <= 480 * MIB < f[-1] * 1.5
    assert all(1.3 < b / a < 1.5 for a, b in zip(f, f[1:]))  # half steps
    assert footprints(1 * MIB, 0) == footprints(1 * MIB, 4 * MIB)  # at least up to 8 level-2 caches


def test_knee_is_the_last_footprint_halfway_from_the_floor_to_the_plateau():
    sizes = [8, 11, 16, 22, 32, 45, 64, 90, 128]
    rates = [26, 26.5, 26, 25, 24, 21, 16, 14, 13]  # plateau 26, floor 13: the line at 19.5
    assert knee(sizes, rates) == 45
    assert knee(sizes, [26, 26.5, 26, 25, 24, 18, 20, 14, 13]) == 32  # a footprint above it after one below: noise
    assert knee(sizes, [20, 20, 19, 19, 18.5, 18, 18, 17.5, 17]) is None  # no level: less than MIN_DROP apart
    assert knee(sizes[:3], rates[:3]) is None
    assert knee(sizes, [26] * 8 + [float("nan")]) is None


def test_measure_without_a_shared_cache_says_so():
    found, why = measure(2 * MIB, 0, 2)
    assert found is None and "no cache beyond level 2" in why


def test_the_stored_share_is_never_above_sysfs_and_says_where_it_comes_from(monkeypatch):
    from tilecast.perfmodel import cache_size

    monkeypatch.setattr(llc_probe, "_MEASURED", {})
    monkeypatch.setattr(cache_size, "llc_per_core", lambda: (64 * MIB, "detected: test"))
    monkeypatch.setattr(llc_probe, "measure", lambda l2, share, cores: (40 * MIB, "measured: test"))
    assert effective_llc_per_core(2 * MIB, 2) == (40 * MIB, "measured: test (detected: test)")
    monkeypatch.setattr(llc_probe, "_MEASURED", {})
    monkeypatch.setattr(llc_probe, "measure", lambda l2, share, cores: (90 * MIB, "measured: test"))
    assert effective_llc_per_core(2 * MIB, 2) == (64 * MIB, "detected: test; measured: test")
    monkeypatch.setattr(llc_probe, "_MEASURED", {})
    monkeypatch.setattr(llc_probe, "measure", lambda l2, share, cores: (None, "no knee: test"))
    assert effective_llc_per_core(2 * MIB, 2) == (64 * MIB, "detected: test; no knee: test")


def test_a_real_stream_is_faster_within_the_level_2_cache_than_far_beyond_it():
    # two footprints on this machine: a quarter of a typical level-2 cache, and 256 MiB (past any core's share)
    rates = llc_probe.stream_rates([256 << 10, 256 * MIB], cores=1)
    print(f"stream: {rates[0] / 2**30:.1f} GiB/s at 256 KiB, {rates[1] / 2**30:.1f} at 256 MiB")
    assert np.isfinite(rates).all() and rates[0] > 1.2 * rates[1]


def test_a_footprint_that_cannot_be_allocated_ends_the_sweep_without_a_hang(monkeypatch):
    class Shim:  # numpy, whose ones() fails past 1 MiB as a full machine's would
        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def ones(n, dtype=None):
            if n * 4 > MIB:
                raise MemoryError("test")
            return np.ones(n, dtype=dtype)

    monkeypatch.setattr(llc_probe, "np", Shim())
    rates = llc_probe.stream_rates([256 << 10, 8 * MIB, 512 << 10], cores=2)
    assert np.isfinite(rates[0]) and np.isnan(rates[1:]).all()
    assert knee([1, 2, 3, 4], [30.0, 30.0, 30.0, float("nan")]) is None
