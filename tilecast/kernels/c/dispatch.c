/* Kernel lookup by registry name, single-threaded BLAS, and the timing loop
 * that calibration microbenchmarks use (the same functions StarPU runs). */
#include <string.h>
#include <time.h>
#include "tc_blas.h"
#include "tilecast_kernels.h"

#define ENTRY(name) {#name, tc_##name}

static const struct {
    const char *name;
    tc_kernel_fn fn;
} TABLE[] = {
    ENTRY(gemm),          ENTRY(fill),          ENTRY(axpy),        ENTRY(bias_add),      ENTRY(bias_grad),
    ENTRY(gelu),          ENTRY(gelu_bwd),      ENTRY(ln_stats),    ENTRY(ln_apply),      ENTRY(ln_bwd_sums),
    ENTRY(ln_bwd_dx),     ENTRY(ln_bwd_params), ENTRY(softmax_stats), ENTRY(softmax_apply), ENTRY(softmax_bwd),
    ENTRY(attn_qk),       ENTRY(attn_pv),       ENTRY(attn_ptv),    ENTRY(attn_rowdot),   ENTRY(embed),
    ENTRY(embed_bwd),     ENTRY(pos_add),       ENTRY(pos_bwd),     ENTRY(ce_target),     ENTRY(ce_loss),
    ENTRY(ce_grad),       ENTRY(adamw),         ENTRY(rms_stats),   ENTRY(rms_apply),     ENTRY(rms_bwd_sums),
    ENTRY(rms_bwd_dx),    ENTRY(rms_bwd_gamma), ENTRY(rope),        ENTRY(swiglu),        ENTRY(swiglu_bwd),
    ENTRY(kv_expand),     ENTRY(kv_reduce),     ENTRY(attn_qk_softmax),
};

int tc_kernel_count(void)
{
    return (int)(sizeof TABLE / sizeof TABLE[0]);
}

const char *tc_kernel_name(int i)
{
    return i >= 0 && i < tc_kernel_count() ? TABLE[i].name : NULL;
}

tc_kernel_fn tc_kernel_lookup(const char *name)
{
    for (int i = 0; i < tc_kernel_count(); i++)
        if (strcmp(TABLE[i].name, name) == 0)
            return TABLE[i].fn;
    return NULL;
}

/* One BLAS thread per caller: parallelism comes from the task runtime's workers. */
void tc_init(void)
{
    tc_blas_set_threads(1);
}

void tc_run(tc_kernel_fn f, const double *p, void *const *buf)
{
    f(p, buf);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void tc_time(tc_kernel_fn f, const double *p, void *const *buf, int repeats, double *seconds)
{
    for (int r = 0; r < repeats; r++) {
        const double t0 = now_s();
        f(p, buf);
        seconds[r] = now_s() - t0;
    }
}
