/* Row-wise softmax over a last axis split across tiles: per row (running max,
 * running sum of exp(s - max)), merged as in Milakov & Gimelshein, "Online
 * normalizer calculation for softmax" (2018). */
#include <math.h>
#include "tilecast_kernels.h"
#include "tc_math.h"

/* p: rows cols beta; bufs: s stats */
TC_KERNEL(softmax_stats)
{
    const float *s = buf[0];
    float *st = buf[1];
    const int64_t rows = TC_I(p[0]), cols = TC_I(p[1]);
    for (int64_t r = 0; r < rows; r++) {
        const float *row = s + r * cols;
        /* The tile comes from memory: ask for the lines TC_AHEAD floats on (as ce_grad does). */
        tc_prefetch_ahead(row, NULL, 0, cols);
        int nan;
        float m_tile = tc_max_nan(row, cols, &nan);
        if (nan)
            m_tile = NAN;
        float m_new, l_old;
        if (p[2] == 0.0) {
            m_new = m_tile;
            l_old = 0.0f;
        } else {
            const float m_old = st[2 * r];
            m_new = isnan(m_old) || isnan(m_tile) ? NAN : (m_old > m_tile ? m_old : m_tile);
            l_old = isfinite(m_new) ? st[2 * r + 1] * expf(m_old - m_new) : 0.0f;
        }
        /* a finite m_new is at least every entry: exponentials of non-positive numbers */
        const double l = isfinite(m_new) ? tc_sum_exp_below(row, cols, m_new) : tc_sum_exp(row, cols, 0.0f);
        st[2 * r] = m_new;
        st[2 * r + 1] = l_old + (float)l;
    }
}

/* p: rows cols; bufs: stats s; s <- exp(s - m) / l */
TC_KERNEL(softmax_apply)
{
    const float *st = buf[0];
    float *s = buf[1];
    const int64_t rows = TC_I(p[0]), cols = TC_I(p[1]);
    for (int64_t r = 0; r < rows; r++) {
        const float m = st[2 * r], l = st[2 * r + 1];
        float *row = s + r * cols;
        for (int64_t j = 0; j < cols; j++)
            row[j] = tc_expf(row[j] - m) / l;
    }
}

/* p: rows cols alpha; bufs: p dp d; dp <- alpha p (dp - d[row]) */
TC_KERNEL(softmax_bwd)
{
    const float *pr = buf[0], *d = buf[2];
    float *dp = buf[1];
    const int64_t rows = TC_I(p[0]), cols = TC_I(p[1]);
    const int scale = p[2] != 1.0;
    const float alpha = (float)p[2];
    for (int64_t r = 0; r < rows; r++) {
        const float dr = d[r];
        const float *pp = pr + r * cols;
        float *o = dp + r * cols;
        for (int64_t j = 0; j < cols; j++) {
            float v = (o[j] - dr) * pp[j];
            o[j] = scale ? v * alpha : v;
        }
    }
}

/* Rows held whole by one tile: softmax_stats (beta 0) then softmax_apply in one
 * sweep per row, with the same operations in the same order (the same bits):
 * each exponential is computed once, stored, summed in tc_sum_exp's lanes, and
 * divided by the sum while the row is still in cache. */
void tc_softmax_rows(float *s, float *st, int64_t rows, int64_t cols)
{
    for (int64_t r = 0; r < rows; r++) {
        float *row = s + r * cols;
        int nan;
        float m = tc_max_nan(row, cols, &nan);
        if (nan)
            m = NAN;
        float l;
        if (isfinite(m)) {
            float acc[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
            int64_t j = 0;
            for (; j + 16 <= cols; j += 16)
                for (int k = 0; k < 16; k++) {
                    const float e = tc_expf_nonpos(row[j + k] - m);
                    row[j + k] = e;
                    acc[k] += e;
                }
            double sum = 0.0;
            for (; j < cols; j++) {
                const float e = tc_expf_nonpos(row[j] - m);
                row[j] = e;
                sum += e;
            }
            for (int k = 0; k < 16; k++)
                sum += acc[k];
            l = 0.0f + (float)sum;
            for (j = 0; j < cols; j++)
                row[j] = row[j] / l;
        } else {
            l = 0.0f + (float)tc_sum_exp(row, cols, 0.0f);
            for (int64_t j = 0; j < cols; j++)
                row[j] = tc_expf(row[j] - m) / l;
        }
        st[2 * r] = m;
        st[2 * r + 1] = l;
    }
}
