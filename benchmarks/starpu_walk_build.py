"""StarPU 1.3.10 built with counters on its memory-chunk list walks, for ``benchmarks/starpu_walk.py``.

Under a memory limit, every allocation in main memory that finds no room
walks StarPU's list of the chunks main memory holds (``memalloc.c``:
``try_to_reuse_potentially_in_use_mc``, then ``free_potentially_in_use_mc``),
and ``starpu_memchunk_tidy`` walks it to write dirty chunks back ahead of need.
Neither is visible from outside the library: a profile says how much time
the walks take, not how long they are. This module builds StarPU from
Debian's source package (``apt-get source starpu``; ``--source`` or
``$TILECAST_STARPU_SRC`` names the unpacked tree, as for the SimGrid build,
:mod:`tilecast.executor.simgrid_build`) with a few lines added to
``memalloc.c`` and ``coherency.c`` that count, per walk, the chunks walked
past and the time spent, into an array the library exports
(``tcw_walk_counters``). The rest of StarPU is unchanged, and it is
configured as Debian's package is where the public headers depend on it (16
memory nodes, 8 buffers per task, 4 CPUs, OpenMP; :data:`CONFIGURE_FLAGS`), so
tilecast's glue, compiled against Debian's headers, runs on it when it is
loaded first (``LD_LIBRARY_PATH``).

The counters (:data:`COUNTERS`, in order):

- reuse walk: calls, chunks walked, chunks of the wanted footprint among them,
  calls that took a chunk, nanoseconds; of the footprint's chunks not taken,
  those in use (``refcnt`` or ``busy_count``), those the only valid copy and
  flagged clean by tidying (their write-back not done), those the only valid
  copy and not flagged (and, of these, those met before tidying's next chunk,
  ``mc_dirty_head``: chunks tidying went past that were written again where
  they lie); of the chunks taken, those flagged clean and those before
  ``mc_dirty_head``;
- eviction walk: calls, chunks walked, nanoseconds (write-backs included);
- allocations in any memory node: calls, nanoseconds (both walks included);
- tidying: passes that found too few clean chunks, chunks walked;
- the held-chunk count summed over the reuse walks (its mean: chunks held);
- task accesses that write a chunk valid in main memory while a request on the
  data is pending (such a chunk is marked dirty where it lies in the list).

Opt-in (not part of CI): the build takes about 5 minutes on 2 cores, into
``$TILECAST_HOME/starpu-walk``, and is reused while its stamp matches.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from tilecast.executor.simgrid_build import STARPU_VERSION, build_lock, run_logged, starpu_source_dir
from tilecast.home import home

CONFIGURE_FLAGS = [
    "--enable-maxcpus=4", "--enable-openmp", "--disable-cuda", "--disable-mpi", "--disable-fortran",
    "--disable-build-doc", "--disable-build-examples", "--disable-build-tests", "--disable-starpufft",
    "--disable-socl", "--disable-starpurm",
]
STAMP = ".tilecast-stamp"
COUNTERS = (
    "reuse_calls", "reuse_walked", "reuse_matched", "reuse_taken", "reuse_ns",
    "evict_calls", "evict_walked", "evict_ns", "allocs", "alloc_ns", "tidy_passes", "tidy_walked",
    "held_sum", "matched_busy", "matched_owner_flagged", "matched_owner_unflagged", "write_with_pending",
    "unflagged_before_dirty_head", "taken_flagged", "taken_before_dirty_head",
)
N_SLOTS = 20

_COUNTER_BLOCK = r"""
/* tilecast: counters on the memory-chunk list walks (benchmarks/starpu_walk_build.py) */
#include <time.h>
unsigned long long tcw_slots[%(n)d];
void tcw_walk_counters(unsigned long long *out, int n)
{
	int i;
	for (i = 0; i < n && i < %(n)d; i++)
		out[i] = __atomic_load_n(&tcw_slots[i], __ATOMIC_RELAXED);
}
static inline unsigned long long tcw_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000ULL + t.tv_nsec;
}
#define TCW(i, n) __atomic_fetch_add(&tcw_slots[i], (unsigned long long) (n), __ATOMIC_RELAXED)
static void tcw_classify(struct _starpu_mem_chunk *mc, unsigned node, int before_dirty_head);
""" % {"n": N_SLOTS}

_CLASSIFY = r"""
/* tilecast: why a chunk of the wanted footprint may not be taken (racy reads: statistics only) */
static void tcw_classify(struct _starpu_mem_chunk *mc, unsigned node, int before_dirty_head)
{
	starpu_data_handle_t h = mc->data;
	int owner = h->per_node[node].state == STARPU_OWNER;
	if (h->per_node[node].refcnt != 0 || h->busy_count != 0)
		TCW(13, 1);
	else if (owner && mc->clean)
		TCW(14, 1);
	else if (owner)
	{
		TCW(15, 1);
		if (before_dirty_head)
			TCW(17, 1);
	}
}
"""

# (file, function signature, anchor in its body, text, "before" or "after" the anchor's line)
_EDITS = [
    ("memalloc.c", "static int try_to_reuse_potentially_in_use_mc(", "_starpu_spin_lock(&mc_lock[node]);",
     "unsigned long long tcw_t0 = tcw_ns(); int tcw_before = 1, tcw_clean = 0, tcw_was_before = 0; "
     "TCW(0, 1); TCW(12, mc_nb[node]);", "before"),
    ("memalloc.c", "static int try_to_reuse_potentially_in_use_mc(",
     "orig_next_mc = next_mc = _starpu_mem_chunk_list_next(mc);",
     "TCW(1, 1); if (mc == mc_dirty_head[node]) tcw_before = 0;", "after"),
    ("memalloc.c", "static int try_to_reuse_potentially_in_use_mc(",
     "success = try_to_throw_mem_chunk(mc, node, replicate, 1);",
     "TCW(2, 1); tcw_classify(mc, node, tcw_before); tcw_clean = mc->clean; tcw_was_before = tcw_before;",
     "before"),
    ("memalloc.c", "static int try_to_reuse_potentially_in_use_mc(", "return success;",
     "TCW(3, success ? 1 : 0); TCW(4, tcw_ns() - tcw_t0); if (success) { TCW(18, tcw_clean); "
     "TCW(19, tcw_was_before); }", "before"),
    ("memalloc.c", "static size_t free_potentially_in_use_mc(", "restart:",
     "unsigned long long tcw_t0 = tcw_ns(); TCW(5, 1);", "before"),
    ("memalloc.c", "static size_t free_potentially_in_use_mc(", "next_mc = _starpu_mem_chunk_list_next(mc);",
     "TCW(6, 1);", "after"),
    ("memalloc.c", "static size_t free_potentially_in_use_mc(", "return freed;", "TCW(7, tcw_ns() - tcw_t0);",
     "before"),
    ("memalloc.c", "void starpu_memchunk_tidy(", "_STARPU_TRACE_START_WRITEBACK_ASYNC(node);", "TCW(10, 1);",
     "after"),
    ("memalloc.c", "void starpu_memchunk_tidy(", "next_mc = _starpu_mem_chunk_list_next(mc);", "TCW(11, 1);",
     "after"),
    ("memalloc.c", "int _starpu_allocate_memory_on_node(",
     "allocated_memory = _starpu_allocate_interface(handle, replicate, dst_node, is_prefetch);",
     "unsigned long long tcw_t0 = tcw_ns();", "before"),
    ("memalloc.c", "int _starpu_allocate_memory_on_node(",
     "allocated_memory = _starpu_allocate_interface(handle, replicate, dst_node, is_prefetch);",
     "TCW(8, 1); TCW(9, tcw_ns() - tcw_t0);", "after"),
    ("coherency.c", "struct _starpu_data_request *_starpu_create_request_to_fetch_data(",
     "if ((!dst_replicate || dst_replicate->state != STARPU_INVALID) && (!nwait || is_prefetch))",
     "{ extern unsigned long long tcw_slots[]; if (dst_replicate && dst_replicate->memory_node == 0 && "
     "dst_replicate->mc && dst_replicate->state != STARPU_INVALID && nwait && !is_prefetch && (mode & STARPU_W)) "
     "__atomic_fetch_add(&tcw_slots[16], 1ULL, __ATOMIC_RELAXED); }", "before"),
]


class BuildError(RuntimeError):
    """The instrumented StarPU could not be built (one line, with the log's path)."""


def _function_span(text: str, signature: str, name: str) -> tuple[int, int]:
    starts, i = [], text.find(signature)
    while i >= 0:
        if i == 0 or text[i - 1] == "\n":  # at a line's start: a definition or a declaration
            starts.append(i)
        i = text.find(signature, i + 1)
    bodies = [i for i in starts if text.find("{", i) < text.find(";", i)]  # the definition, not a declaration
    if len(bodies) != 1:
        raise BuildError(f"{name}: {len(bodies)} definitions of {signature!r} (StarPU {STARPU_VERSION} expected)")
    end = text.find("\n}\n", bodies[0])
    return bodies[0], end


def instrument(text: str, name: str) -> str:
    """``text`` (StarPU's ``memalloc.c`` or ``coherency.c``) with the counters added; :class:`BuildError` if an
    anchor is not where StarPU 1.3.10 has it."""
    if name == "memalloc.c":
        anchor = "#include <common/uthash.h>\n"
        if text.count(anchor) != 1:
            raise BuildError(f"{name}: no single {anchor.strip()!r} to put the counters after")
        text = text.replace(anchor, anchor + _COUNTER_BLOCK, 1) + _CLASSIFY
    for file, signature, anchor, code, where in _EDITS:
        if file != name:
            continue
        start, end = _function_span(text, signature, name)
        body = text[start:end]
        if body.count(anchor) != 1:
            raise BuildError(f"{name}: {anchor!r} found {body.count(anchor)} times in {signature.strip('(')}")
        at = start + body.index(anchor)
        line_start = text.rfind("\n", 0, at) + 1
        indent = text[line_start:at]
        if where == "before":
            text = text[:line_start] + indent + code + "\n" + text[line_start:]
        else:
            line_end = text.index("\n", at)
            text = text[:line_end + 1] + indent + code + "\n" + text[line_end + 1:]
    return text


def walk_prefix() -> Path:
    return home("starpu-walk")


def _stamp_text() -> str:
    return f"starpu {STARPU_VERSION} walk counters {len(COUNTERS)} of {N_SLOTS}\n" + " ".join(CONFIGURE_FLAGS) + "\n"


def ensure_starpu_walk(source=None, jobs: int | None = None) -> Path:
    """The library directory of the instrumented StarPU, building it first if needed (minutes)."""
    prefix = walk_prefix()
    stamp = prefix / STAMP
    if stamp.is_file() and stamp.read_text() == _stamp_text():
        return prefix / "lib"
    with build_lock(prefix.parent / "starpu-walk.lock"):
        if stamp.is_file() and stamp.read_text() == _stamp_text():
            return prefix / "lib"
        src = starpu_source_dir(source)
        work = prefix.parent / "starpu-walk-build"
        log = prefix.parent / "starpu-walk-build.log"
        for d in (work, prefix):
            shutil.rmtree(d, ignore_errors=True)
        tree, build = work / "src", work / "build"
        shutil.copytree(src, tree, symlinks=True)
        if (tree / "config.status").exists():
            raise BuildError(f"{src}: configured in place already; give an unpacked `apt-get source starpu` that "
                             f"was never built")
        for name in ("memalloc.c", "coherency.c"):
            path = tree / "src" / "datawizard" / name
            path.write_text(instrument(path.read_text(), name))
        build.mkdir(parents=True)
        log.write_text("")
        jobs = jobs or os.cpu_count() or 1
        print(f"starpu_walk: building StarPU {STARPU_VERSION} with walk counters into {prefix} (about 5 minutes; "
              f"log: {log})", file=sys.stderr, flush=True)
        label = "StarPU walk-counter build"
        run_logged([str(tree / "configure"), f"--prefix={prefix}"] + CONFIGURE_FLAGS, build, log, "configure", label)
        run_logged(["make", f"-j{jobs}", "-C", "src"], build, log, "make", label)
        run_logged(["make", "-C", "src", "install"], build, log, "make install", label)
        stamp.write_text(_stamp_text())
        shutil.rmtree(work, ignore_errors=True)
    return prefix / "lib"
