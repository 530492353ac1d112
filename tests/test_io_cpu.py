"""The computing time a memory-limited step's disk traffic takes from its workers: measured beside busy threads
(tilecast.perfmodel.io_cpu), charged to workers that fill the cores in the forecast
(tilecast.simulator.memory_capacity)."""

import ctypes
import mmap
import os
from dataclasses import replace

import numpy as np
import pytest
from sim_machines import cpu_machine
from test_memory_forecast import DISK, TILE

from tilecast.graph import GraphBuilder, Tiling
from tilecast.perfmodel import io_cpu
from tilecast.perfmodel.io_cpu import lost_seconds, measure_io_cpu
from tilecast.perfmodel.writeback_pace import TILE as POOL_TILE
from tilecast.perfmodel.writeback_pace import make_pool
from tilecast.simulator.memory_capacity import io_share, simulate_memory_limited


def test_the_time_lost_is_the_busy_threads_products_missing_against_theirs_alone():
    # 2 threads at 100 products/s alone (before 90, after 110), 60/s during 2 s: 2 x 0.4 x 2 s = 1.6 s lost
    assert lost_seconds(90, 60, 110, 2.0, 2) == pytest.approx(1.6)
    assert lost_seconds(100, 120, 100, 2.0, 2) == 0.0  # faster than alone: noise, nothing lost
    assert lost_seconds(0, 0, 0, 2.0, 2) == 0.0


def test_measure_io_cpu_times_three_blocks_beside_busy_threads_and_leaves_no_file(tmp_path, monkeypatch):
    told = []
    monkeypatch.setattr(io_cpu, "make_pool", lambda path, n, **kw: (
        told.append("cached") if kw.get("cached") else None, make_pool(path, n, **kw))[1])
    io = measure_io_cpu(str(tmp_path), 1, nbytes=4 << 20, alone_s=0.1, progress=told.append)
    assert told == ["cached", "write", "read", "hit"] and io.busy == 1
    for name, b in io.blocks.items():
        assert b["alone_before"] > 0 and b["alone_after"] > 0 and b["seconds"] > 0 and b["gbps"] > 0
        assert b["lost_s"] >= 0 and b["lost_s_per_s"] == pytest.approx(b["lost_s"] / b["seconds"])
    # per byte written and read from the cache; per second of reading from the device
    assert io.write == pytest.approx(io.blocks["write"]["lost_s_per_gib"] / 2**30)
    assert io.hit == pytest.approx(io.blocks["hit"]["lost_s_per_gib"] / 2**30)
    assert io.read == pytest.approx(io.blocks["read"]["lost_s_per_s"])
    assert io.blocks["read"]["alone_before"] == io.blocks["write"]["alone_after"]  # one rate between two blocks
    assert "beside 1 threads" in io.source("test") and os.listdir(tmp_path) == []
    # the write block's fsync: the dirty bytes it found over its seconds, where it found enough of them
    assert io.sync_s > 0 and 0 <= io.synced_bytes <= io.nbytes
    if io.synced_bytes >= 0.25 * io.nbytes:
        assert io.writeback == pytest.approx(io.synced_bytes / io.sync_s)
        assert "written back by fsync" in io.writeback_source("test")
    else:
        assert io.writeback == 0
    with pytest.raises(ValueError):
        measure_io_cpu(str(tmp_path), 0)
    with pytest.raises(FileNotFoundError):
        measure_io_cpu(str(tmp_path / "missing"), 1)


def _cached_pages(path) -> tuple[int, int]:
    """(pages of ``path`` in the page cache, pages of it), by mincore(2) on a mapping of the file."""
    size = os.path.getsize(path)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as m:
        view = np.frombuffer(m, dtype=np.uint8)  # the mapping's address, without touching its pages
        ok = libc.mincore(ctypes.c_void_p(view.ctypes.data), size, vec)
        del view
    assert ok == 0, os.strerror(ctypes.get_errno())
    return sum(v & 1 for v in vec), pages


def test_the_written_tiles_are_in_the_cache_before_the_measured_block_rewrites_them(tmp_path):
    # a step rewrites each tile's file in place, into pages the cache holds: the block must not time a first
    # write into fresh pages (on a VM that can cost more than the copy)
    path = str(tmp_path / "pool")
    n = 16
    make_pool(path, n)  # O_DIRECT: on the device
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    cached, pages = _cached_pages(path)
    assert pages == n * POOL_TILE // mmap.PAGESIZE and cached < pages
    make_pool(path, n, cached=True)  # as the write block's pool is made
    assert _cached_pages(path) == (pages, pages)


def test_the_share_is_paid_only_by_workers_that_fill_the_cores_it_was_measured_beside():
    d = replace(DISK, io_cpu_write=1e-9, io_cpu_busy=2)
    assert io_share(d, 2) == 0.5 and io_share(d, 4) == 0.25
    assert io_share(d, 1) == 0.0  # a core left free runs the page cache's work
    assert io_share(DISK, 2) == 0.0  # never measured


def rings_of_axpys(n_tiles: int = 8, rounds: int = 3):
    """Two rings of ``n_tiles`` parameter tiles each; ``rounds`` times, t(i+1) += a t(i) around each ring, the
    rings' tasks interleaved: two chains, one for each worker; every task needs two tiles, and a limit of a few
    tiles evicts in every task."""
    b = GraphBuilder(Tiling.uniform(TILE))
    t = b.tensor("p", (2 * n_tiles * TILE, TILE), ("seq", None), "param")
    for _ in range(rounds):
        for i in range(n_tiles):
            for ring in (0, n_tiles):
                b.add("axpy", [t.tile_ids(ring + i, 0), t.tile_ids(ring + (i + 1) % n_tiles, 0)],
                      dict(n=TILE * TILE, alpha=0.5))
    return b.build()


def test_a_read_that_misses_the_cache_costs_computing_for_the_device_s_time_one_that_hits_for_its_bytes():
    from test_page_cache import CACHE, NODE

    from tilecast.perfmodel.page_cache import CachedDisk
    from tilecast.simulator.memory_capacity import DiskLinks, with_disk

    node = replace(NODE, io_cpu_write=3e-9, io_cpu_read=0.5, io_cpu_hit=1e-9, io_cpu_busy=2)
    m = with_disk(cpu_machine(2), 1 << 30, node)
    links = DiskLinks(m, CachedDisk(node, CACHE), 0.0, node)
    disk = len(m.nodes) - 1
    links.tile = 7
    links.transfer(disk, 0, 1_000_000, 0.0)  # never cached: the device's 100 us + 1 MB at 2 GB/s
    assert links.io_cpu == pytest.approx(0.5 * (1e-4 + 1e6 / 2e9))
    links.transfer(disk, 0, 1_000_000, 1.0)  # cached now
    assert links.io_cpu == pytest.approx(0.5 * (1e-4 + 1e6 / 2e9) + 1e-9 * 1e6)
    links.tile = 8
    links.transfer(0, disk, 2_000_000, 2.0)
    assert links.io_cpu == pytest.approx(0.5 * (1e-4 + 1e6 / 2e9) + 1e-9 * 1e6 + 3e-9 * 2e6)


def test_workers_that_fill_the_cores_pay_the_disk_traffic_s_computing_time():
    """Every byte written and read back costs its computing time (no device measured: every read is the cache's);
    with 2 workers on the 2 cores it was measured beside, both working, the workers pay it, less what is owed
    after their last tasks started, and the step is longer; 1 worker leaves a core free and the step is as without it."""
    graph, limit = rings_of_axpys(), 6 * TILE * TILE * 4
    run = {"durations": np.full((1, graph.n_tasks), 1e-3), "warmup": False, "throttle": None}
    io = replace(DISK, io_cpu_write=2e-9, io_cpu_hit=1e-9, io_cpu_busy=2)
    plain = simulate_memory_limited(graph, cpu_machine(2), limit, DISK, "eager", **run)
    paid = simulate_memory_limited(graph, cpu_machine(2), limit, io, "eager", **run)
    s = paid.summary
    assert s["disk_written_bytes"] > 0 and s["disk_read_bytes"] > 0
    assert s["io_cpu_s"] == pytest.approx(2e-9 * s["disk_written_bytes"] + 1e-9 * s["disk_read_bytes"])
    assert 0.5 * s["io_cpu_s"] < s["io_cpu_charged_s"] <= s["io_cpu_s"] * (1 + 1e-12)
    assert paid.task_io.sum() == pytest.approx(s["io_cpu_charged_s"])
    assert paid.makespan > plain.makespan
    assert plain.summary["io_cpu_s"] == 0 and plain.summary["io_cpu_charged_s"] == 0
    one = simulate_memory_limited(graph, cpu_machine(1), limit, io, "eager", **run)
    alone = simulate_memory_limited(graph, cpu_machine(1), limit, DISK, "eager", **run)
    assert one.summary["io_cpu_s"] > 0 and one.summary["io_cpu_charged_s"] == 0
    assert one.makespan == pytest.approx(alone.makespan, rel=1e-12)


def test_calibrate_stores_the_figures_and_a_remeasured_disk_node_keeps_them(tmp_path, monkeypatch, capsys):
    from tilecast.api.calibration import _io_cpu
    from tilecast.perfmodel.disk_node import load_disk, measure_and_store

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path / "home"))
    machine = cpu_machine(2)
    offload = tmp_path / "offload"
    offload.mkdir()
    disk, path = _io_cpu(machine, replace(DISK, directory=str(offload)), str(offload), True, busy=1, nbytes=4 << 20)
    assert disk.io_cpu_busy == 1 and "beside 1 threads" in disk.io_cpu_source and load_disk(path) == disk
    assert min(disk.io_cpu_write, disk.io_cpu_read, disk.io_cpu_hit) >= 0 and os.listdir(offload) == []
    err = capsys.readouterr().err
    assert "computing time lost beside 1 busy threads" in err
    if disk.device_writeback_bandwidth:  # the fsync found the block's dirty bytes: the flusher's rate
        assert "written back by fsync" in disk.device_writeback_source and disk.flusher_bandwidth > 0
    else:
        assert "the device's write-back rate is not measured" in err
    again, _ = measure_and_store(machine, str(offload), total_bytes=1 << 20, repeats=1)
    assert (again.io_cpu_write, again.io_cpu_busy, again.io_cpu_source) == (
        disk.io_cpu_write, 1, disk.io_cpu_source)


def test_calibrate_says_why_the_figures_are_not_measured_and_keeps_the_stored_ones(tmp_path, monkeypatch, capsys):
    from tilecast.api.calibration import _io_cpu

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path / "home"))
    stored = replace(DISK, directory=str(tmp_path), io_cpu_write=1e-9, io_cpu_busy=2, io_cpu_source="before")
    disk, _ = _io_cpu(cpu_machine(2), stored, str(tmp_path), False, busy=2, nbytes=1 << 60)  # over the free space
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not measured" in err[0] and "the stored figures are kept" in err[0]
    assert disk == stored and os.listdir(tmp_path) == ["home"]


def test_a_write_back_the_flusher_took_during_the_writes_gives_no_rate_and_keeps_the_stored_one(
        tmp_path, monkeypatch, capsys):
    """An fsync that found under a quarter of the block still dirty timed the call more than the device: the
    stored rate stays, and calibrate says so; one that found the block gives its rate."""
    from tilecast.api import calibration
    from tilecast.perfmodel import io_cpu

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path / "home"))
    stored = replace(DISK, directory=str(tmp_path), device_writeback_bandwidth=0.3e9, device_writeback_source="before")

    def measured(synced, seconds):
        return io_cpu.IoCpu(1e-10, 0.5, 1e-10, 2, {}, str(tmp_path), 0.1, 1 << 30,
                            synced / seconds if synced >= 0.25 * (1 << 30) else 0.0, synced, seconds)

    for synced, kept in ((100 << 20, True), (1 << 30, False)):
        monkeypatch.setattr(io_cpu, "measure_io_cpu", lambda *a, m=measured(synced, 0.5), **k: m)
        disk, _ = calibration._io_cpu(cpu_machine(2), stored, str(tmp_path), False, busy=2, nbytes=1 << 20)
        err = capsys.readouterr().err
        assert disk.io_cpu_busy == 2
        if kept:
            assert disk.device_writeback_bandwidth == 0.3e9 and disk.device_writeback_source == "before"
            assert "write-back rate is not measured" in err and "100 MiB of the 1024 MiB" in err
            assert "the stored 0.300 GB/s is kept" in err
        else:
            assert disk.device_writeback_bandwidth == pytest.approx(2 * 2**30) and err == ""
            assert "1.00 GiB of 256 KiB tiles' dirty pages written back by fsync in 0.50 s" in (
                disk.device_writeback_source)
