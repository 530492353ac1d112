/* The disk node's file operations: StarPU's unistd backend, with O_DIRECT for the tiles it can take.
 *
 * StarPU 1.3.10's unistd_o_direct backend (src/core/disk_ops/disk_unistd_o_direct.c) asserts that every
 * transfer is a whole number of pages from a page-aligned buffer, which a model's odd tiles (biases, the
 * last vocabulary tile) are not. Both backends share their transfer functions (disk_unistd_global.c) and
 * differ only in the flags each file is opened with at allocation, so these operations are the unistd
 * ones with an allocation that opens a tile's file with O_DIRECT when its size is a whole number of pages
 * (bypassing the page cache: no copy into it, no reclaim, no write-back by the flusher) and buffered
 * otherwise. StarPU's main-memory buffers are page-aligned from the plug on (starpu_malloc_set_align, as
 * the o_direct backend's plug does). */
#include <unistd.h>
#include <starpu.h>
#include "starpu_glue.h"

static struct starpu_disk_ops direct_ops;
static int64_t direct_files, buffered_files;

static void *alloc_by_size(void *base, size_t size)
{
    const size_t page = (size_t)getpagesize();
    if (size > 0 && size % page == 0) {
        __atomic_add_fetch(&direct_files, 1, __ATOMIC_RELAXED);
        return starpu_disk_unistd_o_direct_ops.alloc(base, size);
    }
    __atomic_add_fetch(&buffered_files, 1, __ATOMIC_RELAXED);
    return starpu_disk_unistd_ops.alloc(base, size);
}

static void *plug_aligned(void *parameter, starpu_ssize_t size)
{
    starpu_malloc_set_align((size_t)getpagesize());
    return starpu_disk_unistd_ops.plug(parameter, size);
}

const struct starpu_disk_ops *tcs_direct_disk_ops(void)
{
    direct_ops = starpu_disk_unistd_ops;
    direct_ops.alloc = alloc_by_size;
    direct_ops.plug = plug_aligned;
    return &direct_ops;
}

void tcs_disk_files(int64_t *direct, int64_t *buffered)
{
    *direct = __atomic_load_n(&direct_files, __ATOMIC_RELAXED);
    *buffered = __atomic_load_n(&buffered_files, __ATOMIC_RELAXED);
}
