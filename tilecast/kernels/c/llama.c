/* Llama-family kernels: RMSNorm split across embedding tiles, rotary position
 * embedding, SwiGLU and the key/value head copies of grouped-query attention,
 * as in tilecast/kernels/definitions/llama.py. */
#include <math.h>
#include <string.h>
#include "tilecast_kernels.h"
#include "tc_math.h"

#define BLOCK 256

/* Sum over j < n of the float product a[j] b[j] (c[j] too when c is not NULL), in 8 independent double
 * accumulators: a single one is a chain of dependent additions that the compiler may not reorder. */
static inline double dot_lanes(const float *a, const float *b, const float *c, int64_t n)
{
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t j = 0;
    if (c)
        for (; j + 8 <= n; j += 8)
            for (int l = 0; l < 8; l++)
                acc[l] += (double)(a[j + l] * b[j + l] * c[j + l]);
    else
        for (; j + 8 <= n; j += 8)
            for (int l = 0; l < 8; l++)
                acc[l] += (double)(a[j + l] * b[j + l]);
    double s = 0.0;
    for (; j < n; j++)
        s += c ? (double)(a[j] * b[j] * c[j]) : (double)(a[j] * b[j]);
    for (int l = 0; l < 8; l++)
        s += acc[l];
    return s;
}

static inline float rms_rstd(float ss, double n, double eps)
{
    return 1.0f / sqrtf(ss / (float)n + (float)eps);
}

/* p: rows cols beta; bufs: x stats; stats[r] (+)= sum of x^2 */
TC_KERNEL(rms_stats)
{
    const float *x = buf[0];
    float *st = buf[1];
    const int64_t rows = TC_I(p[0]), cols = TC_I(p[1]);
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * cols;
        const double s = dot_lanes(row, row, NULL, cols);
        st[r] = p[2] == 0.0 ? (float)s : st[r] + (float)s;
    }
}

/* p: rows cols n eps; bufs: x stats gamma y; y = x rstd gamma */
TC_KERNEL(rms_apply)
{
    const float *x = buf[0], *st = buf[1], *gamma = buf[2];
    float *y = buf[3];
    const int64_t rows = TC_I(p[0]), cols = TC_I(p[1]);
    for (int64_t r = 0; r < rows; r++) {
        const float rs = rms_rstd(st[r], p[2], p[3]);
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        for (int64_t j = 0; j < cols; j++)
            yr[j] = (xr[j] * rs) * gamma[j];
    }
}

/* p: rows cols beta; bufs: x gamma dy sums; sums[r] (+)= sum of dy gamma x */
TC_KERNEL(rms_bwd_sums)
{
    const float *x = buf[0], *gamma = buf[1], *dy = buf[2];
    float *sums = buf[3];
    const int64_t rows = TC_I(p[0]), cols = TC_I(p[1]);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols, *dr = dy + r * cols;
        const double s = dot_lanes(dr, gamma, xr, cols);
        sums[r] = p[2] == 0.0 ? (float)s : sums[r] + (float)s;
    }
}

/* p: rows cols n eps beta; bufs: x stats gamma dy sums dx; dx (+)= rstd dy gamma - x rstd^3 sums / n */
TC_KERNEL(rms_bwd_dx)
{
    const float *x = buf[0], *st = buf[1], *gamma = buf[2], *dy = buf[3], *sums = buf[4];
    float *dx = buf[5];
    const int64_t rows = TC_I(p[0]), cols = TC_I(p[1]);
    const int acc = p[4] != 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const float rs = rms_rstd(st[r], p[2], p[3]);
        const float c = rs * rs * rs * sums[r] / (float)p[2];
        const float *xr = x + r * cols, *dr = dy + r * cols;
        float *o = dx + r * cols;
        for (int64_t j = 0; j < cols; j++) {
            const float d = rs * (dr[j] * gamma[j]) - xr[j] * c;
            o[j] = acc ? o[j] + d : d;
        }
    }
}

/* p: rows cols n eps beta; bufs: x stats dy dgamma; dgamma (+)= column sums of dy x rstd */
TC_KERNEL(rms_bwd_gamma)
{
    const float *x = buf[0], *st = buf[1], *dy = buf[2];
    float *dgamma = buf[3];
    const int64_t rows = TC_I(p[0]), cols = TC_I(p[1]);
    const int acc = p[4] != 0.0;
    double ag[BLOCK];
    for (int64_t c0 = 0; c0 < cols; c0 += BLOCK) {
        const int64_t w = cols - c0 < BLOCK ? cols - c0 : BLOCK;
        for (int64_t j = 0; j < w; j++)
            ag[j] = 0.0;
        for (int64_t r = 0; r < rows; r++) {
            const float rs = rms_rstd(st[r], p[2], p[3]);
            const float *xr = x + r * cols + c0, *dr = dy + r * cols + c0;
            for (int64_t j = 0; j < w; j++)
                ag[j] += (double)(dr[j] * (xr[j] * rs));
        }
        for (int64_t j = 0; j < w; j++)
            dgamma[c0 + j] = acc ? dgamma[c0 + j] + (float)ag[j] : (float)ag[j];
    }
}

/* The half inverse frequencies theta^(-2i/d) rescaled as rope_inv_freq in definitions/llama.py, step by step
 * in float32 (theta^(2i/d) rounded once from double, as torch computes it): factor 1 unscaled; orig_pos 0
 * linear (all divided by factor); else Llama 3.1's scaling (wavelengths 2 pi / f below orig_pos / high_freq
 * kept, above orig_pos / low_freq divided by factor, between interpolated). */
static void rope_inv_freq(float *inv, int64_t d, double theta, double factor, double low_freq, double high_freq,
                          double orig_pos)
{
    const int64_t half = d / 2;
    for (int64_t i = 0; i < half; i++)
        inv[i] = 1.0f / (float)pow(theta, (double)((float)(2 * i) / (float)d));
    if (factor == 1.0)
        return;
    const float f = (float)factor;
    for (int64_t i = 0; i < half; i++) {
        const float scaled = inv[i] / f;
        if (orig_pos == 0.0) {
            inv[i] = scaled;
            continue;
        }
        const float wavelen = (float)6.283185307179586 / inv[i];
        const float low_wl = (float)(orig_pos / low_freq), high_wl = (float)(orig_pos / high_freq);
        const float low = wavelen > low_wl ? scaled : inv[i];
        if (wavelen < high_wl || wavelen > low_wl) {
            inv[i] = low;
            continue;
        }
        const float s = ((float)orig_pos / wavelen - (float)low_freq) / (float)(high_freq - low_freq);
        inv[i] = (1.0f - s) * low / f + s * low;
    }
}

/* p: bt st ht d s0 theta sign factor low_freq high_freq orig_pos; bufs: x (bt, st, ht, d) rotated in place.
 * Angles in float32: (s0 + s) * inv[i], the halves (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin). */
TC_KERNEL(rope)
{
    float *x = buf[0];
    const int64_t bt = TC_I(p[0]), st = TC_I(p[1]), ht = TC_I(p[2]), d = TC_I(p[3]), half = d / 2;
    const float s0 = (float)p[4], sign = (float)p[6];
    float inv[half > 0 ? half : 1], cs[half > 0 ? half : 1], sn[half > 0 ? half : 1];
    rope_inv_freq(inv, d, p[5], p[7], p[8], p[9], p[10]);
    for (int64_t s = 0; s < st; s++) {
        const float pos = (float)s + s0;
        for (int64_t i = 0; i < half; i++) {
            const float a = pos * inv[i];
            cs[i] = cosf(a);
            sn[i] = sign * sinf(a);
        }
        for (int64_t b = 0; b < bt; b++)
            for (int64_t h = 0; h < ht; h++) {
                float *v = x + ((b * st + s) * ht + h) * d;
                for (int64_t i = 0; i < half; i++) {
                    const float x1 = v[i], x2 = v[i + half];
                    v[i] = x1 * cs[i] - x2 * sn[i];
                    v[i + half] = x2 * cs[i] + x1 * sn[i];
                }
            }
    }
}

/* p: n; bufs: g u y; y = g / (1 + exp(-g)) u */
TC_KERNEL(swiglu)
{
    const float *g = buf[0], *u = buf[1];
    float *y = buf[2];
    const int64_t n = TC_I(p[0]);
    for (int64_t i = 0; i < n; i++)
        y[i] = g[i] / (1.0f + tc_expf(-g[i])) * u[i];
}

/* p: n; bufs: g u dy dg du; du = dy silu(g), dg = dy u s (1 + g (1 - s)), s = sigmoid(g) */
TC_KERNEL(swiglu_bwd)
{
    const float *g = buf[0], *u = buf[1], *dy = buf[2];
    float *dg = buf[3], *du = buf[4];
    const int64_t n = TC_I(p[0]);
    for (int64_t i = 0; i < n; i++) {
        const float s = 1.0f / (1.0f + tc_expf(-g[i]));
        du[i] = dy[i] * (g[i] * s);
        dg[i] = dy[i] * u[i] * (s * (1.0f + g[i] * (1.0f - s)));
    }
}

/* p: bt st kt g d; bufs: x (bt, st, kt, d), y (bt, st, kt * g, d): each head copied g times */
TC_KERNEL(kv_expand)
{
    const float *x = buf[0];
    float *y = buf[1];
    const int64_t rows = TC_I(p[0]) * TC_I(p[1]) * TC_I(p[2]), g = TC_I(p[3]), d = TC_I(p[4]);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < g; j++)
            memcpy(y + (r * g + j) * d, x + r * d, (size_t)d * sizeof(float));
}

/* p: bt st kt g d beta; bufs: y (bt, st, kt * g, d), x (bt, st, kt, d) (+)= sums over each group.
 * A group's heads are added in order, head after head over contiguous rows (vectorised), in a block of
 * BLOCK columns at a time. */
TC_KERNEL(kv_reduce)
{
    const float *y = buf[0];
    float *x = buf[1];
    const int64_t rows = TC_I(p[0]) * TC_I(p[1]) * TC_I(p[2]), g = TC_I(p[3]), d = TC_I(p[4]);
    const int acc = p[5] != 0.0;
    float s[BLOCK];
    for (int64_t r = 0; r < rows; r++) {
        const float *yr = y + r * g * d;
        float *o = x + r * d;
        for (int64_t i0 = 0; i0 < d; i0 += BLOCK) {
            const int64_t w = d - i0 < BLOCK ? d - i0 : BLOCK;
            for (int64_t i = 0; i < w; i++)
                s[i] = yr[i0 + i];
            for (int64_t j = 1; j < g; j++) {
                const float *yj = yr + j * d + i0;
                for (int64_t i = 0; i < w; i++)
                    s[i] += yj[i];
            }
            if (acc)
                for (int64_t i = 0; i < w; i++)
                    o[i0 + i] += s[i];
            else
                memcpy(o + i0, s, (size_t)w * sizeof(float));
        }
    }
}
