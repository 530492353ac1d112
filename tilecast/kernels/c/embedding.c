/* Token and position embeddings; the token table is split into vocabulary tiles. */
#include "tilecast_kernels.h"

/* p: tokens vt et v0 beta; bufs: ids w x; x[t] (+)= w[ids[t] - v0] for ids in this tile */
TC_KERNEL(embed)
{
    const int64_t *ids = buf[0];
    const float *w = buf[1];
    float *x = buf[2];
    const int64_t tokens = TC_I(p[0]), vt = TC_I(p[1]), et = TC_I(p[2]), v0 = TC_I(p[3]);
    const int acc = p[4] != 0.0;
    for (int64_t t = 0; t < tokens; t++) {
        float *xr = x + t * et;
        const int64_t local = ids[t] - v0;
        const int hit = local >= 0 && local < vt;
        if (!hit) {
            if (!acc)
                for (int64_t j = 0; j < et; j++)
                    xr[j] = 0.0f;
            continue;
        }
        const float *wr = w + local * et;
        for (int64_t j = 0; j < et; j++)
            xr[j] = acc ? xr[j] + wr[j] : wr[j];
    }
}

/* p: tokens vt et v0 beta; bufs: ids dx dw; dw[ids[t] - v0] (+)= dx[t] (scatter-add in token order) */
TC_KERNEL(embed_bwd)
{
    const int64_t *ids = buf[0];
    const float *dx = buf[1];
    float *dw = buf[2];
    const int64_t tokens = TC_I(p[0]), vt = TC_I(p[1]), et = TC_I(p[2]), v0 = TC_I(p[3]);
    if (p[4] == 0.0)
        for (int64_t i = 0; i < vt * et; i++)
            dw[i] = 0.0f;
    for (int64_t t = 0; t < tokens; t++) {
        const int64_t local = ids[t] - v0;
        if (local < 0 || local >= vt)
            continue;
        float *wr = dw + local * et;
        const float *xr = dx + t * et;
        for (int64_t j = 0; j < et; j++)
            wr[j] += xr[j];
    }
}

/* p: bt st et; bufs: wpe x; x (bt, st, et) += wpe (st, et) */
TC_KERNEL(pos_add)
{
    const float *wpe = buf[0];
    float *x = buf[1];
    const int64_t bt = TC_I(p[0]), n = TC_I(p[1]) * TC_I(p[2]);
    for (int64_t b = 0; b < bt; b++) {
        float *xb = x + b * n;
        for (int64_t i = 0; i < n; i++)
            xb[i] += wpe[i];
    }
}

/* p: bt st et beta; bufs: dx dwpe; dwpe (+)= sum over the batch of dx */
TC_KERNEL(pos_bwd)
{
    tc_colsum(buf[0], TC_I(p[0]), TC_I(p[1]) * TC_I(p[2]), buf[1], p[3] != 0.0);
}
