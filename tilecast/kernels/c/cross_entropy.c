/* Mean next-token cross-entropy over logits split into vocabulary tiles:
 * loss = mean over tokens of (m + log l - logit[target]), with (m, l) the
 * softmax statistics of the token's logits row (softmax.c). */
#include <math.h>
#include "tilecast_kernels.h"
#include "tc_math.h"

/* p: rows vt v0 beta; bufs: logits targets picked; picked[r] (+)= logits[r, target - v0] */
TC_KERNEL(ce_target)
{
    const float *logits = buf[0];
    const int64_t *targets = buf[1];
    float *picked = buf[2];
    const int64_t rows = TC_I(p[0]), vt = TC_I(p[1]), v0 = TC_I(p[2]);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t local = targets[r] - v0;
        if (p[3] == 0.0)
            picked[r] = 0.0f;
        if (local >= 0 && local < vt)
            picked[r] += logits[r * vt + local];
    }
}

/* p: rows scale beta; bufs: stats picked loss; loss (+)= scale * sum of (m + log l - picked) */
TC_KERNEL(ce_loss)
{
    const float *st = buf[0], *picked = buf[1];
    float *loss = buf[2];
    const int64_t rows = TC_I(p[0]);
    double s = 0.0;
    for (int64_t r = 0; r < rows; r++)
        s += (double)(st[2 * r] + logf(st[2 * r + 1]) - picked[r]);
    s *= p[1];
    loss[0] = p[2] == 0.0 ? (float)s : (float)((double)loss[0] + s);
}

/* p: rows vt v0 scale; bufs: logits stats targets; logits <- scale (softmax - onehot) */
TC_KERNEL(ce_grad)
{
    float *logits = buf[0];
    const float *st = buf[1];
    const int64_t *targets = buf[2];
    const int64_t rows = TC_I(p[0]), vt = TC_I(p[1]), v0 = TC_I(p[2]);
    const float scale = (float)p[3];
    for (int64_t r = 0; r < rows; r++) {
        const float m = st[2 * r], l = st[2 * r + 1];
        /* One multiply per entry instead of a division and a multiply: a vector division takes
         * about as long as the whole exponential; the result differs by rounding (a few ulp). */
        const float factor = scale / l;
        float *row = logits + r * vt;
        const int64_t local = targets[r] - v0;
        const int hit = local >= 0 && local < vt;
        const float target_logit = hit ? row[local] : 0.0f;
        const int below = isfinite(m);
        /* One sweep; the target's entry, (softmax - 1) * scale, is redone below as the reference does. */
        /* In chunks, each first asking for the lines TC_AHEAD floats on: the logits come from memory (written
         * long before), and the hardware prefetchers stop at 4 KiB page boundaries. */
        for (int64_t c0 = 0; c0 < vt; c0 += TC_CHUNK) {
            const int64_t c1 = c0 + TC_CHUNK < vt ? c0 + TC_CHUNK : vt;
            for (int64_t q = c0 + TC_AHEAD; q < c1 + TC_AHEAD; q += 16)
                __builtin_prefetch(row + q, 1); /* past the row: the next rows (a prefetch never faults) */
            if (below) /* m, the row's maximum (softmax_stats), is finite: exponentials of numbers <= 0 */
                for (int64_t j = c0; j < c1; j++)
                    row[j] = tc_expf_nonpos(row[j] - m) * factor;
            else
                for (int64_t j = c0; j < c1; j++)
                    row[j] = tc_expf(row[j] - m) * factor;
        }
        if (hit)
            row[local] = (tc_expf(target_logit - m) / l - 1.0f) * scale;
    }
}
