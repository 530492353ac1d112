"""The page cache in front of the disk node's device: writes at the cache's speed until the dirty pages reach
Linux's threshold, then at the device's; reads of tiles still cached at the cache's speed, others at the
device's; the thresholds read from the machine; the device timed with O_DIRECT."""

from dataclasses import replace

import numpy as np
import pytest
from sim_machines import cpu_machine
from test_memory_forecast import DISK, S, two_axpys

from tilecast.perfmodel.disk_node import DiskNode, DiskNodeError, for_offload_io, measure_device
from tilecast.perfmodel.page_cache import CachedDisk, PageCache, page_cache_for, run_process_bytes
from tilecast.simulator.memory_capacity import simulate_memory_limited

MB = 1_000_000
#: the cache: 10 GB/s write, 20 GB/s read, 10 / 5 us per transfer; the device: 1 GB/s write, 2 GB/s read + 100 us
NODE = DiskNode(10e9, 20e9, 1e-5, 5e-6, device_write_bandwidth=1e9, device_read_bandwidth=2e9,
                device_read_latency=1e-4, device_source="test figures")
CACHE = PageCache(capacity_bytes=1000 * MB, dirty_bytes=100 * MB, background_bytes=50 * MB)


def write_stream(disk: CachedDisk, n: int, nbytes: int = MB, first_tile: int = 0, t: float = 0.0) -> list[float]:
    """``n`` tiles written back to back from ``t`` (each starts when the last ends, as on the disk link); their
    ends."""
    ends = []
    for i in range(n):
        t += disk.write(first_tile + i, nbytes, t)
        ends.append(t)
    return ends


def test_a_write_stream_under_the_dirty_threshold_runs_at_the_cache_speed():
    disk = CachedDisk(NODE, CACHE)
    ends = write_stream(disk, 90)  # 90 MB < 100 MB dirty threshold
    assert ends[-1] == pytest.approx(90 * (NODE.write_latency + MB / NODE.write_bandwidth), rel=1e-12)
    assert disk.throttled_s == 0


def test_a_write_stream_over_the_threshold_runs_at_the_device_speed():
    disk = CachedDisk(NODE, CACHE)
    ends = write_stream(disk, 2000)  # 2 GB: the dirty pages reach 100 MB after about 110 MB
    steady = (ends[-1] - ends[999]) / (1000 * MB)  # seconds per byte over the last 1 GB
    assert steady == pytest.approx(1 / NODE.device_write_bandwidth, rel=1e-6)
    assert disk.throttled_s > 0
    # the flusher keeps the dirty bytes at the threshold, and has written back the rest
    assert disk.dirty == pytest.approx(CACHE.dirty_bytes, rel=1e-9)
    assert disk.written_back == pytest.approx(2000 * MB - CACHE.dirty_bytes, rel=1e-9)


def test_the_flusher_drains_to_the_background_threshold_while_the_writer_is_idle():
    disk = CachedDisk(NODE, CACHE)
    write_stream(disk, 90)
    disk.read(0, MB, 10.0)  # ten seconds later: the flusher has written back down to 50 MB
    assert disk.dirty == pytest.approx(CACHE.background_bytes)
    assert disk.written_back == pytest.approx(40 * MB)


def test_a_recently_written_tile_is_read_from_the_cache_an_old_one_from_the_device():
    disk = CachedDisk(NODE, CACHE)
    write_stream(disk, 10)
    hit = disk.read(3, MB, 1.0)
    assert hit == pytest.approx(NODE.read_latency + MB / NODE.read_bandwidth, rel=1e-12)
    write_stream(disk, 1000, first_tile=100, t=2.0)  # 1 GB more: tiles 0-9 leave the cache (LRU)
    miss = disk.read(5, MB, 100.0)
    assert miss == pytest.approx(NODE.device_read_latency + MB / NODE.device_read_bandwidth, rel=1e-12)
    assert disk.read(5, MB, 101.0) == pytest.approx(hit, rel=1e-12)  # read back: cached again
    assert (disk.hits, disk.misses) == (2, 1)


def test_a_device_read_waits_for_the_write_back_request_ahead_and_the_flusher_goes_on():
    """Reads and the write-back share the device: a read from the device while the flusher writes back takes its
    own time plus one write-back request of as many bytes at the device's write bandwidth (the sum of both bytes
    over their bandwidths), and the flusher does not stop meanwhile."""
    disk = CachedDisk(NODE, CACHE)
    t0 = write_stream(disk, 90)[-1]  # about 85 MB dirty then, over the 50 MB background threshold
    dirty, written = disk.dirty, disk.written_back
    assert dirty > CACHE.background_bytes + MB
    took = disk.read(5000, MB, t0)  # a tile never cached: the device's
    own = NODE.device_read_latency + MB / NODE.device_read_bandwidth
    assert took == pytest.approx(own + MB / NODE.device_write_bandwidth, rel=1e-12)
    assert disk.reads_behind_writeback == 1
    disk.read(0, MB, t0 + took)  # a cached tile, read when the device's read ended: the flusher wrote meanwhile
    assert disk.written_back - written == pytest.approx(took * NODE.device_write_bandwidth, rel=1e-9)


def test_a_device_read_with_nothing_to_write_back_is_the_device_alone():
    disk = CachedDisk(NODE, CACHE)
    write_stream(disk, 40)  # 40 MB dirty: under the background threshold, the flusher idle
    took = disk.read(5000, MB, 1.0)
    assert took == pytest.approx(NODE.device_read_latency + MB / NODE.device_read_bandwidth, rel=1e-12)
    assert disk.reads_behind_writeback == 0 and disk.written_back == 0


def test_writers_past_the_threshold_wait_for_the_measured_write_back_rate():
    """Where the flusher's sustained rate was measured (far under the device's O_DIRECT bandwidth), a stream of
    writes past the dirty threshold runs at that rate, and waits for it."""
    slow = replace(NODE, device_writeback_bandwidth=0.1e9, device_writeback_source="test figures")
    disk = CachedDisk(slow, CACHE)
    ends = write_stream(disk, 1000)
    steady = (ends[-1] - ends[499]) / (500 * MB)
    assert steady == pytest.approx(1 / slow.device_writeback_bandwidth, rel=1e-6)
    assert disk.dirty == pytest.approx(CACHE.dirty_bytes, rel=1e-9)
    fast = CachedDisk(NODE, CACHE)  # not measured: the device's write bandwidth, 10 times as fast here
    write_stream(fast, 1000)
    assert disk.throttled_s > 5 * fast.throttled_s > 0
    assert "write-back 0.100 GB/s" in slow.describe()


def test_thresholds_read_from_the_machine(tmp_path):
    (tmp_path / "dirty_ratio").write_text("20\n")
    (tmp_path / "dirty_background_ratio").write_text("10\n")
    (tmp_path / "dirty_bytes").write_text("0\n")
    (tmp_path / "dirty_background_bytes").write_text("0\n")
    proc = run_process_bytes(12 << 30, 98_316)
    assert proc == (12 << 30) + (130 << 20) + 98_316 * 4472
    c = page_cache_for(proc, available_bytes=proc + (10 << 30), vm=str(tmp_path))
    assert c.capacity_bytes == 10 << 30
    assert c.dirty_bytes == pytest.approx(2 << 30) and c.background_bytes == pytest.approx(1 << 30)
    (tmp_path / "dirty_bytes").write_text("536870912\n")  # dirty_bytes, where set, replaces the ratio
    assert page_cache_for(proc, available_bytes=proc + (10 << 30), vm=str(tmp_path)).dirty_bytes == 512 << 20
    here = page_cache_for(1 << 20)  # this machine's
    assert here.capacity_bytes > 0 and 0 < here.background_bytes <= here.dirty_bytes <= here.capacity_bytes
    print(here.describe(), here.source)


def test_the_forecast_goes_through_the_cache_where_the_device_was_measured():
    """test_memory_forecast.test_eviction_by_hand's step (2 write-backs, t0 read from disk, then t2 and t3 read
    back). Without device figures the step is what it was. With them and a large cache, t2 and t3, just written,
    are read from the cache and t0, never cached, from the device; with no cache every read is the device's and
    every write waits for its write-back, so the step is longer."""
    run = {"durations": np.full((1, 2), 1e-3), "warmup": False, "throttle": None}
    plain = simulate_memory_limited(two_axpys(), cpu_machine(1), 3 * S, DISK, "eager", **run)
    dev = replace(DISK, device_write_bandwidth=DISK.write_bandwidth / 10, device_read_bandwidth=DISK.read_bandwidth / 10,
                  device_read_latency=1e-3, device_source="test figures")
    big = simulate_memory_limited(two_axpys(), cpu_machine(1), 3 * S, dev, "eager",
                                  page_cache=PageCache(1 << 30, 1 << 28, 1 << 27), **run)
    s = big.summary
    assert (s["page_cache_read_hits"], s["page_cache_read_misses"]) == (2, 1)
    miss_extra = (1e-3 + S / dev.device_read_bandwidth) - (DISK.read_latency + S / DISK.read_bandwidth)
    assert big.makespan == pytest.approx(plain.makespan + miss_extra, rel=1e-12)
    none = simulate_memory_limited(two_axpys(), cpu_machine(1), 3 * S, dev, "eager",
                                   page_cache=PageCache(0, 0, 0), **run)
    assert none.summary["page_cache_read_misses"] == 3 and none.summary["page_cache_throttled_s"] > 0
    assert none.makespan > big.makespan
    for k in ("evictions", "writebacks", "disk_written_bytes", "disk_read_bytes"):
        assert none.summary[k] == big.summary[k] == plain.summary[k]


def test_direct_offload_io_is_forecast_at_the_device_figures_without_the_cache():
    """--offload-io direct: every transfer at the device's O_DIRECT figures, no page cache, none of its
    computing time; the same step's reads read back at the device's speed as a step with no cache at all reads
    them, without waiting for a write-back."""
    run = {"durations": np.full((1, 2), 1e-3), "warmup": False, "throttle": None}
    dev = replace(DISK, device_write_bandwidth=DISK.write_bandwidth / 10, device_read_bandwidth=DISK.read_bandwidth / 10,
                  device_read_latency=1e-3, device_source="test figures", io_cpu_write=1e-9, io_cpu_busy=2)
    direct = dev.direct()
    assert (direct.write_bandwidth, direct.read_bandwidth) == (dev.device_write_bandwidth, dev.device_read_bandwidth)
    assert direct.read_latency == 1e-3 and not direct.has_device and direct.io_cpu_write == 0
    assert for_offload_io(dev, "direct") == direct and for_offload_io(dev, "buffered") is dev
    assert for_offload_io(None, "direct") is None
    with pytest.raises(DiskNodeError, match="^offload_io: the device under"):
        DISK.direct()  # its device was not measured
    # StarPU's costs: those fitted on probes run direct where calibrate --offload-io direct fitted them
    buffered = replace(dev, worker_costs={"per_task": 1e-6}, worker_costs_by_workers={"2": {"per_task": 2e-6}})
    assert buffered.direct().costs_for(2) == {"per_task": 2e-6}
    fitted = replace(buffered, direct_costs={"worker_costs": {"per_task": 5e-6},
                                             "worker_costs_by_workers": {"2": {"per_task": 6e-6}}, "source": "test"})
    assert fitted.direct().costs_for(2) == {"per_task": 6e-6} and fitted.direct().worker_costs == {"per_task": 5e-6}
    assert "with --offload-io direct: 5 us per task" in fitted.describe()
    res = simulate_memory_limited(two_axpys(), cpu_machine(1), 3 * S, direct, "eager", **run)
    plain = simulate_memory_limited(two_axpys(), cpu_machine(1), 3 * S, DISK, "eager", **run)
    assert "page_cache_read_hits" not in res.summary and res.summary["io_cpu_s"] == 0
    assert res.makespan > plain.makespan  # the device is ten times slower than the cache's figures
    for k in ("evictions", "writebacks", "disk_written_bytes", "disk_read_bytes"):
        assert res.summary[k] == plain.summary[k]


def test_the_device_is_timed_with_o_direct(tmp_path):
    fields = measure_device(str(tmp_path), total_bytes=4 << 20, repeats=1)
    print(fields)
    if fields.get("device_write_bandwidth"):
        assert fields["device_read_bandwidth"] > 0 and fields["device_source"].startswith("measured: O_DIRECT")
    else:  # a file system without O_DIRECT (tmpfs): said so, and the forecast keeps the cache's figures
        assert fields["device_source"].startswith("not measured")
        assert not replace(NODE, device_write_bandwidth=0.0).has_device


def test_a_writer_waiting_for_write_back_does_not_hold_the_disk_link():
    """A write past the dirty threshold sleeps until the flusher has made room; the device meanwhile serves reads:
    a read asked for then starts when the write's own part (the cache's) ended, not after its wait."""
    from tilecast.simulator.memory_capacity import DiskLinks, with_disk

    slow = replace(NODE, device_writeback_bandwidth=0.1e9)
    m = with_disk(cpu_machine(1), 1 << 30, slow)
    cache = CachedDisk(slow, CACHE)
    links, disk = DiskLinks(m, cache), len(m.nodes) - 1
    t = 0.0
    for i in range(150):  # 150 MB written back to back: past the 100 MB threshold, the last writes wait
        before = cache.throttled_s
        links.tile = i
        t = links.transfer(0, disk, MB, t)
    waited = cache.throttled_s - before
    assert waited > 0.009  # 1 MB at the flusher's 0.1 GB/s, less the cache's part
    links.tile = 10_000  # a tile never cached: the device's, behind one write-back request
    end = links.transfer(disk, 0, MB, 0.0)
    read = NODE.device_read_latency + MB / NODE.device_read_bandwidth + MB / NODE.device_write_bandwidth
    assert end == pytest.approx(t - waited + read, rel=1e-9)


def test_writers_waiting_together_queue_for_the_flusher():
    """Two writes past the threshold asked for at the same moment: the second waits for the room the flusher makes
    after the first's, and the dirty bytes stay at the threshold (no writer is let past it)."""
    slow = replace(NODE, device_writeback_bandwidth=0.1e9)
    disk = CachedDisk(slow, CACHE)
    t = write_stream(disk, 100)[-1]  # at the 100 MB threshold
    first = disk.write(1000, MB, t)
    second = disk.write(1001, MB, t)
    assert second == pytest.approx(first + MB / slow.device_writeback_bandwidth, rel=1e-6)
    assert disk.dirty <= CACHE.dirty_bytes * (1 + 1e-9)


def test_the_write_back_owed_at_the_end_of_a_step_is_owed_in_the_next():
    """Writers that waited past a step's end left the flusher busy beyond it: the next step's first write past the
    threshold waits for that too (the flusher's clock carries over, less the step's length)."""
    slow = replace(NODE, device_writeback_bandwidth=0.1e9)
    disk = CachedDisk(slow, CACHE)
    t = write_stream(disk, 100)[-1]
    ends = [t + disk.write(1000 + i, MB, t) for i in range(5)]  # five writers at once: the flusher owes 5 MB
    disk.next_step(after=t)  # the step ended when they were asked for
    assert disk.t == pytest.approx(ends[-1] - t, rel=1e-9)
    assert disk.write(2000, MB, 0.0) == pytest.approx(ends[-1] - t + MB / slow.device_writeback_bandwidth, rel=1e-6)


def test_overlapping_waits_for_write_back_count_once_in_the_wall_time():
    """Five writers asked for at once past the threshold wait together: their waits' sum counts the overlap five
    times, the wall time during which one waited counts it once (the last one's wait)."""
    slow = replace(NODE, device_writeback_bandwidth=0.1e9)
    disk = CachedDisk(slow, CACHE)
    t = write_stream(disk, 100)[-1]
    took = [disk.write(1000 + i, MB, t) for i in range(5)]
    cache_part = NODE.write_latency + MB / NODE.write_bandwidth
    s = disk.summary()
    assert s["page_cache_throttled_writes"] == 5
    assert s["page_cache_throttled_wall_s"] == pytest.approx(max(took) - cache_part, rel=1e-9)
    assert s["page_cache_throttled_s"] == pytest.approx(sum(took) - 5 * cache_part, rel=1e-9)
    assert s["page_cache_throttled_s"] > 2.5 * s["page_cache_throttled_wall_s"]
    # up to the step's end only: a wait past it (StarPU's tidying write-backs) is not the step's
    assert disk.throttled_wall_s(t + cache_part + 0.001) == pytest.approx(0.001, rel=1e-6)
