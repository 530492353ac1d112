/* Layer normalisation split across embedding tiles; statistics per row are
 * (mean, M2) merged with the parallel-variance formula of Chan, Golub &
 * LeVeque (1979), as in tilecast/kernels/definitions/layernorm.py. */
#include <math.h>
#include "tilecast_kernels.h"

#define BLOCK 256
#define LANES 8

/* Sums of a row in LANES independent double accumulators (a single accumulator is one long chain of
 * dependent additions that the compiler may not reorder), added up at the end. */
static inline double sum_lanes(const float *x, int64_t n)
{
    double acc[LANES] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++)
            acc[l] += x[j + l];
    double s = 0.0;
    for (; j < n; j++)
        s += x[j];
    for (int l = 0; l < LANES; l++)
        s += acc[l];
    return s;
}

/* Sum of (x - mean)^2 over a row (each square in float, as the reference), in LANES double accumulators. */
static inline double sq_dev_lanes(const float *x, int64_t n, float mean)
{
    double acc[LANES] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++) {
            const float d = x[j + l] - mean;
            acc[l] += d * d;
        }
    double s = 0.0;
    for (; j < n; j++) {
        const float d = x[j] - mean;
        s += d * d;
    }
    for (int l = 0; l < LANES; l++)
        s += acc[l];
    return s;
}

static inline float rstd_of(const float *st, double n, double eps)
{
    return 1.0f / sqrtf(st[1] / (float)n + (float)eps);
}

/* p: rows cols count beta; bufs: x stats */
TC_KERNEL(ln_stats)
{
    const float *x = buf[0];
    float *st = buf[1];
    const int64_t rows = TC_I(p[0]), cols = TC_I(p[1]);
    const double na = p[2], nb = p[1], n = na + nb;
    const float c_mean = (float)(nb / n), c_m2 = (float)(na * nb / n);
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * cols;
        const float mean = (float)(sum_lanes(row, cols) / (double)cols);
        const double m2 = sq_dev_lanes(row, cols, mean);
        float *o = st + 2 * r;
        if (p[3] == 0.0) {
            o[0] = mean;
            o[1] = (float)m2;
        } else {
            const float delta = mean - o[0];
            o[0] += delta * c_mean;
            o[1] += (float)m2 + delta * delta * c_m2;
        }
    }
}

/* p: rows cols n eps; bufs: x stats gamma beta y */
TC_KERNEL(ln_apply)
{
    const float *x = buf[0], *st = buf[1], *gamma = buf[2], *beta = buf[3];
    float *y = buf[4];
    const int64_t rows = TC_I(p[0]), cols = TC_I(p[1]);
    for (int64_t r = 0; r < rows; r++) {
        const float mean = st[2 * r], rstd = rstd_of(st + 2 * r, p[2], p[3]);
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        for (int64_t j = 0; j < cols; j++)
            yr[j] = (xr[j] - mean) * rstd * gamma[j] + beta[j];
    }
}

/* p: rows cols n eps beta; bufs: x stats gamma dy sums; sums[r] (+)= (sum g, sum g xhat), g = dy gamma */
TC_KERNEL(ln_bwd_sums)
{
    const float *x = buf[0], *st = buf[1], *gamma = buf[2], *dy = buf[3];
    float *sums = buf[4];
    const int64_t rows = TC_I(p[0]), cols = TC_I(p[1]);
    for (int64_t r = 0; r < rows; r++) {
        const float mean = st[2 * r], rstd = rstd_of(st + 2 * r, p[2], p[3]);
        const float *xr = x + r * cols, *dr = dy + r * cols;
        double a1[LANES] = {0, 0, 0, 0, 0, 0, 0, 0}, a2[LANES] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t j = 0;
        for (; j + LANES <= cols; j += LANES)
            for (int l = 0; l < LANES; l++) {
                const float g = dr[j + l] * gamma[j + l];
                a1[l] += g;
                a2[l] += g * ((xr[j + l] - mean) * rstd);
            }
        double s1 = 0.0, s2 = 0.0;
        for (; j < cols; j++) {
            const float g = dr[j] * gamma[j];
            s1 += g;
            s2 += g * ((xr[j] - mean) * rstd);
        }
        for (int l = 0; l < LANES; l++) {
            s1 += a1[l];
            s2 += a2[l];
        }
        if (p[4] == 0.0) {
            sums[2 * r] = (float)s1;
            sums[2 * r + 1] = (float)s2;
        } else {
            sums[2 * r] += (float)s1;
            sums[2 * r + 1] += (float)s2;
        }
    }
}

/* p: rows cols n eps beta; bufs: x stats gamma dy sums dx;
 * dx (+)= rstd (g - mean(g) - xhat mean(g xhat)) */
TC_KERNEL(ln_bwd_dx)
{
    const float *x = buf[0], *st = buf[1], *gamma = buf[2], *dy = buf[3], *sums = buf[4];
    float *dx = buf[5];
    const int64_t rows = TC_I(p[0]), cols = TC_I(p[1]);
    const float inv_n = (float)(1.0 / p[2]);
    const int acc = p[4] != 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const float mean = st[2 * r], rstd = rstd_of(st + 2 * r, p[2], p[3]);
        const float m1 = sums[2 * r] * inv_n, m2 = sums[2 * r + 1] * inv_n;
        const float *xr = x + r * cols, *dr = dy + r * cols;
        float *o = dx + r * cols;
        for (int64_t j = 0; j < cols; j++) {
            const float xhat = (xr[j] - mean) * rstd;
            const float d = rstd * (dr[j] * gamma[j] - m1 - xhat * m2);
            o[j] = acc ? o[j] + d : d;
        }
    }
}

/* p: rows cols n eps beta; bufs: x stats dy dgamma dbeta;
 * dgamma (+)= column sums of dy xhat, dbeta (+)= column sums of dy */
TC_KERNEL(ln_bwd_params)
{
    const float *x = buf[0], *st = buf[1], *dy = buf[2];
    float *dgamma = buf[3], *dbeta = buf[4];
    const int64_t rows = TC_I(p[0]), cols = TC_I(p[1]);
    const int acc = p[4] != 0.0;
    double ag[BLOCK], ab[BLOCK];
    for (int64_t c0 = 0; c0 < cols; c0 += BLOCK) {
        const int64_t w = cols - c0 < BLOCK ? cols - c0 : BLOCK;
        for (int64_t j = 0; j < w; j++)
            ag[j] = ab[j] = 0.0;
        for (int64_t r = 0; r < rows; r++) {
            const float mean = st[2 * r], rstd = rstd_of(st + 2 * r, p[2], p[3]);
            const float *xr = x + r * cols + c0, *dr = dy + r * cols + c0;
            for (int64_t j = 0; j < w; j++) {
                ag[j] += dr[j] * ((xr[j] - mean) * rstd);
                ab[j] += dr[j];
            }
        }
        for (int64_t j = 0; j < w; j++) {
            dgamma[c0 + j] = acc ? dgamma[c0 + j] + (float)ag[j] : (float)ag[j];
            dbeta[c0 + j] = acc ? dbeta[c0 + j] + (float)ab[j] : (float)ab[j];
        }
    }
}
