/* AdamW update of one parameter tile, as torch.optim.AdamW computes it, with
 * decoupled weight decay (Loshchilov & Hutter 2019). Mirrors the float32
 * evaluation order of tilecast/kernels/definitions/adamw.py (the same bits).
 *
 * One division per entry: sqrt(v) is multiplied by 1 / sqrt(1 - b2^t) rather
 * than divided by sqrt(1 - b2^t). Vector division and square root share one
 * unit (about 10-12 cycles per 16 floats each on AVX-512), so with two
 * divisions and a square root a warm tile was bound by that unit, not by
 * memory. */
#include <math.h>
#include "tilecast_kernels.h"

/* p: n lr beta1 beta2 eps weight_decay step; bufs: p g m v */
TC_KERNEL(adamw)
{
    /* Distinct tiles: restrict lets the loop vectorise without run-time overlap checks. */
    float *restrict w = buf[0], *restrict m = buf[2], *restrict v = buf[3];
    const float *restrict g = buf[1];
    const int64_t n = TC_I(p[0]);
    const double lr = p[1], b1 = p[2], b2 = p[3], eps = p[4], wd = p[5], step = p[6];
    const float decay = (float)(1.0 - lr * wd);
    const float fb1 = (float)b1, fb1c = (float)(1.0 - b1), fb2 = (float)b2, fb2c = (float)(1.0 - b2);
    const float inv_sb2 = (float)(1.0 / sqrt(1.0 - pow(b2, step)));
    const float step_size = (float)(lr / (1.0 - pow(b1, step)));
    const float feps = (float)eps;
    for (int64_t i = 0; i < n; i++) {
        const float gi = g[i];
        const float mi = m[i] * fb1 + fb1c * gi;
        const float vi = v[i] * fb2 + fb2c * gi * gi;
        m[i] = mi;
        v[i] = vi;
        w[i] = w[i] * decay - step_size * (mi / (sqrtf(vi) * inv_sb2 + feps));
    }
}
