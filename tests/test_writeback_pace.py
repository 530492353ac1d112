"""A buffered write stream's pace (benchmarks/disk_contention.py): the paced rate fitted from (time, bytes written,
dirty bytes) samples, the stream's files removed also when it is interrupted; a write-back rate stored with the disk
node is taken by the forecast's flusher over the device's O_DIRECT rate."""

import math
import os
import time
from dataclasses import replace

import pytest
from sim_machines import cpu_machine

from tilecast.perfmodel.disk_node import DiskNode, ensure_disk, load_disk, measure_and_store, save_disk
from tilecast.perfmodel.page_cache import CachedDisk, PageCache
from tilecast.perfmodel.writeback_pace import TILE, NoRoom, measure_writeback, paced_rate, pool_for

GiB = 2**30
BG = 2.2 * GiB  # the background threshold /proc gives


def stream(seconds=12.0, free_gbps=2.0, level=2.1 * GiB, pace_gbps=0.3, step=0.1, wobble=20 << 20):
    """Samples of a stream that writes at ``free_gbps`` until its dirty bytes reach ``level``, then at the
    flusher's ``pace_gbps`` with the dirty bytes held at ``level`` (give or take ``wobble``)."""
    out, written, t = [], 0.0, 0.0
    while t <= seconds:
        dirty = min(written, level)
        if dirty >= level:
            dirty += wobble * math.sin(7 * t)
        out.append((t, int(written), int(dirty)))
        written += (free_gbps if written < level else pace_gbps) * 1e9 * step
        t = round(t + step, 6)
    return out


def test_the_paced_rate_is_what_the_flusher_wrote_once_the_dirty_bytes_hold():
    rate, reached, why = paced_rate(stream(), BG)
    assert why == "" and rate == pytest.approx(0.3e9, rel=0.03)
    assert 0.9 < reached < 1.3  # the free-running part (2.1 GiB at 2 GB/s) is left out


def test_a_stream_whose_dirty_bytes_overshoot_is_fitted_once_they_fell_back_to_their_level():
    # as measured with the page cache free: up to 3.5 GiB at the cache's speed, back to 2.1 GiB within a second
    # (the flusher catching up), then held there at the pace
    base = stream(seconds=12.0)
    shaped = []
    for t, b, d in base:
        if 1.0 <= t < 2.0:
            d = int(2.1 * GiB + 1.4 * GiB * (2.0 - t))  # 3.5 GiB falling to 2.1 GiB
        shaped.append((t, b, d))
    rate, reached, why = paced_rate(shaped, BG)
    assert why == "" and reached >= 1.9, (rate, reached, why)  # fitted from the fall back, not the first rise
    assert rate == pytest.approx(0.3e9, rel=0.05)


def test_no_pace_under_the_background_threshold_or_without_a_hold():
    rate, reached, why = paced_rate(stream(level=0.5 * GiB), BG)  # the flusher never had to keep up
    assert rate == 0 and reached is None and "under 50% of the background threshold" in why
    short = stream(seconds=2.0)  # paced for under a second after settling
    rate, reached, why = paced_rate(short, BG)
    assert rate == 0 and reached is not None and "ended" in why
    rising = [(t, b, b // 2) for t, b, _ in stream(free_gbps=0.4, level=100 * GiB)]  # dirty bytes keep rising
    rate, _, why = paced_rate(rising, BG)
    assert rate == 0 and "not paced" in why
    assert paced_rate(stream()[:2], BG)[0] == 0


def test_the_pool_is_refused_where_the_directory_lacks_the_space(tmp_path):
    huge = PageCache(1e16, 1e16, 5e15)
    with pytest.raises(NoRoom, match="needs .* GiB in .* free"):
        pool_for(str(tmp_path), huge, cap=1 << 60)
    small = PageCache(8 * GiB, 64 << 20, 32 << 20)
    assert pool_for(str(tmp_path), small) % TILE == 0 and pool_for(str(tmp_path), small, cap=4 * TILE) == 4 * TILE
    # twice the hard threshold and a GiB: the dirty bytes pass the free-run ceiling with the flusher at full speed
    assert pool_for(str(tmp_path), small) == (2 * (64 << 20) + GiB) // TILE * TILE


def test_a_short_real_stream_gives_a_rate_and_leaves_no_file(tmp_path):
    """A pool of 16 MiB, far under the dirty threshold: the stream runs at the cache's speed, is not paced (the
    documented fallback: no pace, the reason said) and every file is removed."""
    try:
        pace = measure_writeback(str(tmp_path), seconds=1.0, pool_bytes=16 << 20)
    except OSError as e:
        pytest.skip(f"O_DIRECT refused in {tmp_path}: {e}")
    print(pace.to_dict())
    assert math.isfinite(pace.stream_bandwidth) and pace.stream_bandwidth > 0
    assert pace.written_bytes == 16 << 20 and not pace.paced and pace.bandwidth == 0 and pace.reason
    assert os.listdir(tmp_path) == []


def test_a_stream_beside_busy_threads_keeps_them_computing_and_says_so(tmp_path):
    """Two threads multiply matrices while the block lasts (each did products; none after it ends) and leave the
    BLAS with the threads it had; a stream beside them records them."""
    from threadpoolctl import threadpool_info

    from tilecast.perfmodel.writeback_pace import BusyCores

    before = [p["num_threads"] for p in threadpool_info()]
    with BusyCores(2) as busy:
        time.sleep(0.3)
    done = list(busy.products)
    time.sleep(0.1)
    assert len(done) == 2 and min(done) > 0 and busy.products == done
    assert [p["num_threads"] for p in threadpool_info()] == before
    try:
        pace = measure_writeback(str(tmp_path), seconds=0.5, pool_bytes=8 << 20, busy=2)
    except OSError as e:
        pytest.skip(f"O_DIRECT refused in {tmp_path}: {e}")
    assert pace.busy == 2 and pace.to_dict()["busy"] == 2 and os.listdir(tmp_path) == []


@pytest.mark.parametrize("phase", ["pool", "stream"])
def test_the_stream_removes_its_files_when_interrupted(tmp_path, phase):
    def stop(now, done, total):
        if now == phase:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        measure_writeback(str(tmp_path), seconds=5.0, pool_bytes=32 << 20, progress=stop)
    assert os.listdir(tmp_path) == []


DEVICE = DiskNode(10e9, 20e9, 1e-5, 5e-6, device_write_bandwidth=1e9, device_read_bandwidth=2e9,
                  device_read_latency=1e-4, device_source="test figures")


def test_the_stored_pace_is_kept_and_taken_by_the_forecast(tmp_path, monkeypatch):
    """Stored with the disk node, kept by a re-measurement on the same file system, and the forecast's flusher
    writes at it rather than at the O_DIRECT rate; without it, at the O_DIRECT rate."""
    monkeypatch.setenv("TILECAST_HOME", str(tmp_path / "home"))
    machine = cpu_machine(2)
    cache = PageCache(1000e6, 100e6, 50e6)
    assert CachedDisk(replace(DEVICE, directory=str(tmp_path)), cache).wb_inv == pytest.approx(1 / 1e9)
    paced = replace(DEVICE, directory=str(tmp_path), device_writeback_bandwidth=0.3e9,
                    device_writeback_source="measured: tilecast calibrate, a test")
    assert load_disk(save_disk(machine, paced)) == paced
    first_use = ensure_disk(machine, str(tmp_path))  # what simulate and tune read: the stored node
    assert first_use.flusher_bandwidth == 0.3e9
    assert CachedDisk(first_use, cache).wb_inv == pytest.approx(1 / 0.3e9)
    again, _ = measure_and_store(machine, str(tmp_path), total_bytes=1 << 20, repeats=1)
    if again.has_device:  # O_DIRECT measured here: the pace is kept beside the new device figures
        assert again.device_writeback_bandwidth == 0.3e9 and "tilecast calibrate" in again.device_writeback_source
        monkeypatch.setattr("tilecast.perfmodel.disk_node.other_file_systems", lambda a, b: True)
        other, _ = measure_and_store(machine, str(tmp_path), total_bytes=1 << 20, repeats=1)
        assert other.device_writeback_bandwidth == 0 and other.flusher_bandwidth == other.device_write_bandwidth


def test_a_pace_is_dropped_only_for_a_directory_on_another_file_system(tmp_path):
    from tilecast.perfmodel.disk_node import other_file_systems

    assert other_file_systems(str(tmp_path), "/proc")  # procfs: another file system
    assert not other_file_systems(str(tmp_path), str(tmp_path))
    assert not other_file_systems(str(tmp_path / "gone"), str(tmp_path))  # removed since: nothing known
