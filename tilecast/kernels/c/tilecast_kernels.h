/* tilecast tile kernels for CPU workers.
 *
 * Every kernel of the Python registry (tilecast/kernels/definitions) has one
 * C function here with the same name, computing what its numpy reference
 * computes: `p` is the task's parameter vector in registry order, `buf` its
 * flat tile buffers in registry order (float32, except int64 ids/targets).
 */
#ifndef TILECAST_KERNELS_H
#define TILECAST_KERNELS_H

#include <stdint.h>

typedef void (*tc_kernel_fn)(const double *p, void *const *buf);

#define TC_KERNEL(name) void tc_##name(const double *p, void *const *buf)

/* gemm.c */
TC_KERNEL(gemm);
/* elementwise.c */
TC_KERNEL(fill);
TC_KERNEL(axpy);
TC_KERNEL(bias_add);
TC_KERNEL(bias_grad);
TC_KERNEL(gelu);
TC_KERNEL(gelu_bwd);
/* layernorm.c */
TC_KERNEL(ln_stats);
TC_KERNEL(ln_apply);
TC_KERNEL(ln_bwd_sums);
TC_KERNEL(ln_bwd_dx);
TC_KERNEL(ln_bwd_params);
/* softmax.c */
TC_KERNEL(softmax_stats);
TC_KERNEL(softmax_apply);
TC_KERNEL(softmax_bwd);
/* attention.c */
TC_KERNEL(attn_qk);
TC_KERNEL(attn_pv);
TC_KERNEL(attn_ptv);
TC_KERNEL(attn_rowdot);
TC_KERNEL(attn_qk_softmax);
/* embedding.c */
TC_KERNEL(embed);
TC_KERNEL(embed_bwd);
TC_KERNEL(pos_add);
TC_KERNEL(pos_bwd);
/* cross_entropy.c */
TC_KERNEL(ce_target);
TC_KERNEL(ce_loss);
TC_KERNEL(ce_grad);
/* adamw.c */
TC_KERNEL(adamw);
/* llama.c */
TC_KERNEL(rms_stats);
TC_KERNEL(rms_apply);
TC_KERNEL(rms_bwd_sums);
TC_KERNEL(rms_bwd_dx);
TC_KERNEL(rms_bwd_gamma);
TC_KERNEL(rope);
TC_KERNEL(swiglu);
TC_KERNEL(swiglu_bwd);
TC_KERNEL(kv_expand);
TC_KERNEL(kv_reduce);

/* dispatch.c: lookup by registry name, and a timing loop for calibration. */
tc_kernel_fn tc_kernel_lookup(const char *name);
int tc_kernel_count(void);
const char *tc_kernel_name(int i);
void tc_init(void);
void tc_run(tc_kernel_fn f, const double *p, void *const *buf);
void tc_time(tc_kernel_fn f, const double *p, void *const *buf, int repeats, double *seconds);

/* reduce.c: column sums of a row-major (rows x cols) float matrix, in double,
 * added to or stored into out (bias and position-embedding gradients). */
void tc_softmax_rows(float *s, float *stats, int64_t rows, int64_t cols);
void tc_colsum(const float *x, int64_t rows, int64_t cols, float *out, int accumulate);

#define TC_I(v) ((int64_t)(v))

/* Kernels streaming tiles from memory (ce_grad, softmax_stats, gelu, gelu_bwd) work in chunks of TC_CHUNK floats, prefetching TC_AHEAD
 * floats ahead (tried on adamw too: slower there, 0.85x). */
#define TC_CHUNK 512
#define TC_AHEAD 2048

/* Prefetch the lines TC_AHEAD floats past [c0, c1) of r (to be read) and, unless NULL, of w (to be written). */
static inline void tc_prefetch_ahead(const float *r, const float *w, int64_t c0, int64_t c1)
{
    for (int64_t q = c0 + TC_AHEAD; q < c1 + TC_AHEAD; q += 16) {
        __builtin_prefetch(r + q, 0);
        if (w)
            __builtin_prefetch(w + q, 1);
    }
}

#endif
