/* Element-wise and broadcast kernels: fill, axpy, bias, GELU. */
#include <math.h>
#include "tilecast_kernels.h"
#include "tc_math.h"

/* GPT-2's tanh approximation of GELU (Hendrycks & Gimpel 2016), in float32
 * exactly as the numpy reference evaluates it. */
#define GELU_C 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

/* p: n value */
TC_KERNEL(fill)
{
    float *x = buf[0];
    const int64_t n = TC_I(p[0]);
    const float v = (float)p[1];
    for (int64_t i = 0; i < n; i++)
        x[i] = v;
}

/* p: n alpha; y += alpha x */
TC_KERNEL(axpy)
{
    const float *x = buf[0];
    float *y = buf[1];
    const int64_t n = TC_I(p[0]);
    const float a = (float)p[1];
    if (p[1] == 1.0)
        for (int64_t i = 0; i < n; i++)
            y[i] += x[i];
    else
        for (int64_t i = 0; i < n; i++)
            y[i] += a * x[i];
}

/* p: m n; y (m x n) += b (n) */
TC_KERNEL(bias_add)
{
    const float *b = buf[0];
    float *y = buf[1];
    const int64_t m = TC_I(p[0]), n = TC_I(p[1]);
    for (int64_t r = 0; r < m; r++) {
        float *row = y + r * n;
        for (int64_t j = 0; j < n; j++)
            row[j] += b[j];
    }
}

/* p: m n beta; db (+)= column sums of dy (m x n) */
TC_KERNEL(bias_grad)
{
    tc_colsum(buf[0], TC_I(p[0]), TC_I(p[1]), buf[1], p[2] != 0.0);
}

/* p: n; y = gelu_tanh(x) */
TC_KERNEL(gelu)
{
    const float *x = buf[0];
    float *y = buf[1];
    const int64_t n = TC_I(p[0]);
    for (int64_t c0 = 0; c0 < n; c0 += TC_CHUNK) { /* prefetching ahead, as ce_grad does */
        const int64_t c1 = c0 + TC_CHUNK < n ? c0 + TC_CHUNK : n;
        tc_prefetch_ahead(x, y, c0, c1);
        for (int64_t i = c0; i < c1; i++) {
            const float v = x[i];
            y[i] = (0.5f * v) * (1.0f + tc_tanhf(GELU_C * (v + GELU_A * v * v * v)));
        }
    }
}

/* p: n; dy *= gelu_tanh'(x) */
TC_KERNEL(gelu_bwd)
{
    const float *x = buf[0];
    float *dy = buf[1];
    const int64_t n = TC_I(p[0]);
    const float a3 = 3.0f * GELU_A;
    for (int64_t c0 = 0; c0 < n; c0 += TC_CHUNK) { /* prefetching ahead, as ce_grad does */
        const int64_t c1 = c0 + TC_CHUNK < n ? c0 + TC_CHUNK : n;
        tc_prefetch_ahead(x, dy, c0, c1);
        for (int64_t i = c0; i < c1; i++) {
            const float v = x[i];
            const float t = tc_tanhf(GELU_C * (v + GELU_A * v * v * v));
            const float d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * GELU_C * (1.0f + a3 * v * v);
            dy[i] *= d;
        }
    }
}
