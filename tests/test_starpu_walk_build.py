"""The walk counters' insertion into StarPU's sources (benchmarks/starpu_walk_build.py), on stand-in sources that
have StarPU 1.3.10's function signatures and anchor lines: each counter lands in its function, at its line."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from starpu_walk_build import COUNTERS, N_SLOTS, BuildError, instrument  # noqa: E402

MEMALLOC = """#include <common/uthash.h>

static int try_to_reuse_potentially_in_use_mc(unsigned node, starpu_data_handle_t handle)
{
	int success = 0;
	_starpu_spin_lock(&mc_lock[node]);
	for (mc = first; mc; mc = next_mc)
	{
		orig_next_mc = next_mc = _starpu_mem_chunk_list_next(mc);
		success = try_to_throw_mem_chunk(mc, node, replicate, 1);
	}
	return success;
}

static size_t free_potentially_in_use_mc(unsigned node, unsigned force, size_t reclaim)
{
	size_t freed = 0;
restart:
	for (mc = first; mc; mc = next_mc)
	{
		next_mc = _starpu_mem_chunk_list_next(mc);
	}
	return freed;
}

void starpu_memchunk_tidy(unsigned node)
{
		_STARPU_TRACE_START_WRITEBACK_ASYNC(node);
		for (mc = head; mc; mc = next_mc)
		{
			next_mc = _starpu_mem_chunk_list_next(mc);
		}
}

int _starpu_allocate_memory_on_node(starpu_data_handle_t handle)
{
	allocated_memory = _starpu_allocate_interface(handle, replicate, dst_node, is_prefetch);
	return 0;
}
"""


def _body(text: str, signature: str) -> str:
    start = text.index(signature)
    return text[start:text.index("\n}\n", start)]


def test_each_counter_lands_in_its_function_at_its_line():
    out = instrument(MEMALLOC, "memalloc.c")
    assert out.index("unsigned long long tcw_slots[%d];" % N_SLOTS) > out.index("#include <common/uthash.h>")
    reuse = _body(out, "static int try_to_reuse_potentially_in_use_mc(")
    lines = [ln.strip() for ln in reuse.splitlines()]
    lock = lines.index("_starpu_spin_lock(&mc_lock[node]);")
    assert lines[lock - 1].startswith("unsigned long long tcw_t0 = tcw_ns();")  # timed from before the lock
    nxt = lines.index("orig_next_mc = next_mc = _starpu_mem_chunk_list_next(mc);")
    assert lines[nxt + 1].startswith("TCW(1, 1);")  # one per chunk walked
    throw = lines.index("success = try_to_throw_mem_chunk(mc, node, replicate, 1);")
    assert lines[throw - 1].startswith("TCW(2, 1); tcw_classify(mc, node, tcw_before);")
    assert lines[lines.index("return success;") - 1].startswith("TCW(3, success ? 1 : 0); TCW(4, tcw_ns() - tcw_t0);")
    evict = [ln.strip() for ln in _body(out, "static size_t free_potentially_in_use_mc(").splitlines()]
    assert evict[evict.index("restart:") - 1] == "unsigned long long tcw_t0 = tcw_ns(); TCW(5, 1);"
    assert evict[evict.index("next_mc = _starpu_mem_chunk_list_next(mc);") + 1] == "TCW(6, 1);"
    tidy = [ln.strip() for ln in _body(out, "void starpu_memchunk_tidy(").splitlines()]
    assert tidy[tidy.index("_STARPU_TRACE_START_WRITEBACK_ASYNC(node);") + 1] == "TCW(10, 1);"
    assert tidy[tidy.index("next_mc = _starpu_mem_chunk_list_next(mc);") + 1] == "TCW(11, 1);"
    alloc = [ln.strip() for ln in _body(out, "int _starpu_allocate_memory_on_node(").splitlines()]
    call = alloc.index("allocated_memory = _starpu_allocate_interface(handle, replicate, dst_node, is_prefetch);")
    assert (alloc[call - 1], alloc[call + 1]) == ("unsigned long long tcw_t0 = tcw_ns();",
                                                   "TCW(8, 1); TCW(9, tcw_ns() - tcw_t0);")
    assert "static void tcw_classify(struct _starpu_mem_chunk *mc, unsigned node, int before_dirty_head)\n{" in out
    assert len(COUNTERS) <= N_SLOTS


def test_an_anchor_missing_or_twice_is_refused_by_name():
    with pytest.raises(BuildError, match="return freed;"):
        instrument(MEMALLOC.replace("\treturn freed;\n", ""), "memalloc.c")
    twice = MEMALLOC.replace("\t\tnext_mc = _starpu_mem_chunk_list_next(mc);\n\t}\n\treturn freed;",
                             "\t\tnext_mc = _starpu_mem_chunk_list_next(mc);\n"
                             "\t\tnext_mc = _starpu_mem_chunk_list_next(mc);\n\t}\n\treturn freed;")
    with pytest.raises(BuildError, match="found 2 times in static size_t free_potentially_in_use_mc"):
        instrument(twice, "memalloc.c")
    with pytest.raises(BuildError, match="0 definitions of 'void starpu_memchunk_tidy\\('"):
        instrument(MEMALLOC.replace("void starpu_memchunk_tidy(", "void starpu_memchunk_tidied("), "memalloc.c")
