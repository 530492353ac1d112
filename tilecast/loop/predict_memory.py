"""The forecast of a memory-limited run on the local machine: what ``run --memory-limit`` and
``benchmarks/out_of_core.py`` print beside their measurements."""

from __future__ import annotations


def predict_limited(cfg, batch: int, seq: int, tiling, sched: str, workers: int, limit_bytes: int,
                    offload_dir: str | None, recompute: str = "none", graph=None, machine=None,
                    keep_result: bool = False, page_cache=None, offload_io: str = "buffered"):
    """The :class:`~tilecast.loop.predict.Prediction` of one step of the configuration under a main-memory
    limit of ``limit_bytes`` with a disk node in ``offload_dir`` (None: no disk node), on the local machine
    with its stored models (kernel calibration, host costs, the disk node measured by ``tilecast calibrate``
    there or now; StarPU's cost of walking its list of tiles, ``walk_s``, only if the run prefetches,
    :func:`~tilecast.executor.memory_limit.limit_prefetches`). Its ``summary`` holds the predicted
    ``evictions``, ``writebacks``, ``dropped``,
    ``disk_written_bytes`` and ``disk_read_bytes`` of a step after a warm-up step. ``page_cache``: the page
    cache in front of the disk's device (:class:`~tilecast.perfmodel.page_cache.PageCache`; None: what this
    machine's memory leaves the run when the forecast is made). ``offload_io``: ``"direct"`` forecasts the disk
    node's files written with O_DIRECT (:meth:`~tilecast.perfmodel.disk_node.DiskNode.direct`)."""
    from dataclasses import replace

    from tilecast.executor.memory_limit import MemoryLimitError, limit_prefetches
    from tilecast.loop.config import StepConfig
    from tilecast.loop.predict import predict, stored_models
    from tilecast.perfmodel import load_machine
    from tilecast.perfmodel.disk_node import ensure_disk, for_offload_io
    from tilecast.simulator.memory_capacity import MemoryForecast

    machine = machine or load_machine("local")
    config = StepConfig(cfg, batch, seq, tiling, sched, workers, recompute)
    graph = graph if graph is not None else config.build()
    calibration, host_costs = stored_models(machine)
    disk = for_offload_io(ensure_disk(machine, offload_dir) if offload_dir is not None else None, offload_io)
    if disk is not None and not limit_prefetches():  # the list walks of failed prefetches: none to forecast
        disk = replace(disk, walk_s=0.0)
    forecast = MemoryForecast(limit_bytes, disk, page_cache)
    refused = forecast.refusal([graph], workers)
    if refused:
        raise MemoryLimitError(f"memory_limit: {refused}")
    return predict(config, machine, calibration, host_costs, graph=graph, memory=forecast, keep_result=keep_result)


def predicted_fields(p) -> dict:
    """The forecast's figures for a JSON object (seconds, bytes, counts per step)."""
    s = p.summary
    return {"step_s": p.step_s, "makespan_s": p.makespan_s, "host_s": p.host_s,
            "disk_written_bytes": s.get("disk_written_bytes", 0), "disk_read_bytes": s.get("disk_read_bytes", 0),
            "evictions": s.get("evictions", 0), "writebacks": s.get("writebacks", 0), "dropped": s.get("dropped", 0),
            "tidied": s.get("tidied", 0), "disk_transfers": s.get("transfers", 0),
            "disk_writes": s.get("disk_writes", 0), "disk_reads": s.get("disk_reads", 0),
            "resident_per_transfer": s.get("resident_per_transfer", 0.0),
            # the page cache in front of the device (where calibrate measured the device): its figures, reads
            # served from it and from the device, the writers' waits for write-back (summed over writers, and
            # the time during which at least one waited) and the writes that waited
            "page_cache": s.get("page_cache"), "page_cache_read_hits": s.get("page_cache_read_hits", 0),
            "page_cache_read_misses": s.get("page_cache_read_misses", 0),
            "page_cache_throttled_s": s.get("page_cache_throttled_s", 0.0),
            "page_cache_throttled_wall_s": s.get("page_cache_throttled_wall_s", 0.0),
            "page_cache_throttled_writes": s.get("page_cache_throttled_writes", 0)}


def predicted_fields_apart(*args, **kwargs) -> dict:
    """:func:`predicted_fields` of :func:`predict_limited` (same arguments), computed in a forked child
    process, so that the simulator's memory (its task tables, event lists and what the allocator keeps
    of them after they are freed: about 250 MiB for gpt2-xl at tile 256) is never part of the caller's
    resident set. Out-of-core benchmarks forecast this way before they start StarPU, whose peak RSS
    they report against the limit. Fork before StarPU starts (its threads do not survive a fork).
    The child's error (:class:`~tilecast.simulator.engine.SimulationError`,
    :class:`~tilecast.executor.memory_limit.MemoryLimitError`, ...) is raised here."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork")) as pool:
        return pool.submit(_fields, args, kwargs).result()


def _fields(args, kwargs) -> dict:
    return predicted_fields(predict_limited(*args, **kwargs))
