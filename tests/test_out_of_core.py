"""What a memory-limited process holds beyond its limit: StarPU's record of each registered tile, the
forecast kept out of the measured process, and benchmarks/out_of_core.py's peak RSS against the formula."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tilecast.executor.memory_limit import HANDLE_BYTES, MIB, MemoryLimitError, overhead_bytes
from tilecast.graph import Tiling
from tilecast.graph.model_config import load_model
from tilecast.graph.models import build_step
from tilecast.loop.predict_memory import predict_limited, predicted_fields, predicted_fields_apart

CFG = load_model("gpt2-tiny")
ROOT = Path(__file__).resolve().parents[1]


def test_each_registered_tile_costs_starpu_about_handle_bytes(tmp_path):
    # in a fresh process: memory other tests freed would take the handles without growing the RSS
    code = f"""
from tilecast.executor.managed_tiles import ManagedTileStore
from tilecast.executor.memory_limit import MIB, MemoryLimit, current_rss_bytes
from tilecast.executor.starpu_session import StarPUSession
from tilecast.graph import Tiling
from tilecast.graph.model_config import load_model
from tilecast.graph.models import build_step
graph = build_step(load_model("gpt2-tiny"), 1, 64, Tiling.parse("8"))  # about 10,000 tiles, none allocated
with StarPUSession("eager", 1, memory=MemoryLimit(64 * MIB, {str(tmp_path)!r})) as session:
    before = current_rss_bytes()
    store = ManagedTileStore(graph, session)
    print(graph.n_tiles, (current_rss_bytes() - before) / graph.n_tiles)
    store.close()
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    n_tiles, per_tile = map(float, out.stdout.split())
    assert n_tiles > 5000
    assert 0.5 * HANDLE_BYTES < per_tile < 1.5 * HANDLE_BYTES, per_tile


def test_forecast_in_a_child_process_equals_the_forecast_here(tmp_path):
    """The same forecast in a child; the page cache fixed (this machine's MemAvailable, which it reads otherwise,
    moves between the two)."""
    from tilecast.perfmodel.page_cache import PageCache

    args = (CFG, 1, 32, Tiling.parse("32"), "dmda", 2, 4 * MIB, str(tmp_path))
    cache = {"page_cache": PageCache(1 << 30, 1 << 28, 1 << 27)}
    assert predicted_fields_apart(*args, **cache) == predicted_fields(predict_limited(*args, **cache))
    with pytest.raises(MemoryLimitError, match="minimum is"):
        predicted_fields_apart(CFG, 1, 32, Tiling.parse("32"), "dmda", 2, 1024, str(tmp_path))


def test_out_of_core_peak_rss_within_the_limit_plus_the_overhead_formula(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    limit = 2 * MIB  # the step has about 4 MiB of tiles: some go to disk in every step
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/out_of_core.py"), "--model", "gpt2-tiny",
                          "--batch", "2", "--seq", "32", "--tile", "32", "--memory-limit", str(limit),
                          "--offload-dir", str(tmp_path), "--warmup", "1", "--steps", "1"],
                         check=False, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["memory_limit_bytes"] == limit and res["disk_bytes"]["written"] > 0
    graph = build_step(CFG, 2, 32, Tiling.parse("32"))
    assert res["tiles"] == graph.n_tiles
    assert res["expected_overhead_bytes"] == overhead_bytes(graph, res["rss_before_start_bytes"], limit)
    assert res["overhead_bytes"] == res["peak_rss_bytes"] - limit
    # the process's peak: at most the limit plus the formula's overhead, with a margin (seen here: -5 to +30 MiB)
    assert res["peak_rss_bytes"] <= limit + res["expected_overhead_bytes"] + 64 * MIB, {k: res[k] for k in ("peak_rss_bytes", "expected_overhead_bytes", "rss_before_start_bytes")}
    # what the machine did during the timed step: one entry, spanning the step, shares of the processors' time
    (system,) = res["system_per_step"]
    assert system["seconds"] >= res["step_times_s"][0] * 0.999
    shares = [system[k] for k in ("cpu_user", "cpu_system", "cpu_idle", "cpu_iowait", "cpu_steal")]
    assert all(0 <= x <= 1 for x in shares) and sum(shares) <= 1 + 1e-9
    assert system["process_user_s"] + system["process_system_s"] > 0 and system["dirty_max_bytes"] >= 0
    assert system["device_written_bytes"] >= 0 and 0 <= system["device_busy"]
    assert res["process_cpu_s_per_step"] == system["process_user_s"] + system["process_system_s"]
    # the StarPU workers' own threads apart from the process's others (clock ticks of 10 ms: a tick's slack)
    process_s = system["process_user_s"] + system["process_system_s"]
    assert 0 < system["workers_cpu_s"] <= process_s + 0.02 and system["workers_waiting_for_a_core_s"] >= 0
    assert system["process_other_cpu_s"] == pytest.approx(process_s - system["workers_cpu_s"])
    assert system["outside_process_cpu_s"] >= -0.05 and system["reclaimed_bytes"] >= 0


def _mapped_and_freed(setting: bool) -> tuple[int, float]:
    """How many of 256 blocks of 256 KiB glibc maps on their own (mallinfo2's hblks), and the share of
    their memory that freeing them gives back to the system, in a fresh process (glibc's setting is
    for the process's life), after a 16 MiB block was freed, as StarPU frees tiles."""
    code = f"""
import ctypes
from tilecast.executor.memory_limit import current_rss_bytes, map_tile_buffers
if {setting}:
    assert map_tile_buffers()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                              "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = MallInfo2
libc.free(libc.malloc(16 << 20))  # a mapped block freed: glibc's threshold rises to it, unless set
start, mapped = current_rss_bytes(), libc.mallinfo2().hblks
big = []
for _ in range(256):
    big.append(libc.malloc(256 << 10)); ctypes.memset(big[-1], 1, 256 << 10)
held, mapped = current_rss_bytes(), libc.mallinfo2().hblks - mapped
for p in big:
    libc.free(p)
print(mapped, (held - current_rss_bytes()) / (held - start))
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    mapped, freed = out.stdout.split()
    return int(mapped), float(freed)


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's malloc settings (Linux only)")
def test_tile_buffers_freed_under_a_limit_go_back_to_the_system():
    mapped, freed = _mapped_and_freed(True)
    # nearly all mapped on their own: a free chunk of the heap large enough may still serve one (255 seen once)
    assert mapped >= 250 and freed > 0.9, (mapped, freed)
    # glibc's default serves them from its heaps, where freed memory stays unless it is at the top
    assert _mapped_and_freed(False)[0] == 0
