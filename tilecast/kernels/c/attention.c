/* Batched attention products, one CBLAS call per (batch, head) pair.
 *
 * Q, K, V, O and gradients are (batch, seq, head, head_dim) tiles: the rows of
 * one head are strided by head * head_dim. Scores/probabilities are
 * (batch, head, seq_q, seq_k) tiles, contiguous per (batch, head). */
#include <math.h>
#include "tc_blas.h"
#include "tilecast_kernels.h"

/* Rows per block of a causal score tile (attn_qk). */
#define QK_ROWS 64

/* The (sq x sk) scores of one (batch, head) pair: S = alpha Q K^T, masked when causal.
 * p: bt ht sq sk d alpha q0 k0 causal. */
static void qk_pair(const double *p, const float *qbh, const float *kbh, float *sbh)
{
    const int64_t ht = TC_I(p[1]), sq = TC_I(p[2]), sk = TC_I(p[3]), d = TC_I(p[4]);
    const int64_t q0 = TC_I(p[6]), k0 = TC_I(p[7]);
    const int ld = (int)(ht * d);
    const int causal = p[8] != 0.0;
    /* Causal: rows from full_from on keep every column (one product); rows before it go in blocks of
     * QK_ROWS, each product only over the columns some row of the block keeps (the others are masked
     * below), so that fully masked blocks cost nothing. */
    int64_t full_from = causal ? sk - 1 - q0 + k0 : 0;
    full_from = full_from < 0 ? 0 : full_from > sq ? sq : full_from;
    for (int64_t i0 = 0; i0 < full_from; i0 += QK_ROWS) {
        const int64_t rows = full_from - i0 > QK_ROWS ? QK_ROWS : full_from - i0;
        int64_t cols = q0 + i0 + rows - k0; /* columns 0 .. cols-1 hold a kept entry */
        cols = cols < 0 ? 0 : cols > sk ? sk : cols;
        if (cols > 0)
            tc_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)cols, (int)d, (float)p[5],
                     qbh + i0 * ld, ld, kbh, ld, 0.0f, sbh + i0 * sk, (int)sk);
    }
    if (full_from < sq)
        tc_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(sq - full_from), (int)sk, (int)d, (float)p[5],
                 qbh + full_from * ld, ld, kbh, ld, 0.0f, sbh + full_from * sk, (int)sk);
    if (causal)
        for (int64_t i = 0; i < sq; i++) {
            int64_t first = q0 + i - k0 + 1; /* first masked column: k0 + j > q0 + i */
            if (first < 0)
                first = 0;
            for (int64_t j = first; j < sk; j++)
                sbh[i * sk + j] = -INFINITY;
        }
}

/* p: bt ht sq sk d alpha q0 k0 causal; bufs: q k s; S = alpha Q K^T, masked when causal */
TC_KERNEL(attn_qk)
{
    const float *q = buf[0], *k = buf[1];
    float *s = buf[2];
    const int64_t bt = TC_I(p[0]), ht = TC_I(p[1]), sq = TC_I(p[2]), sk = TC_I(p[3]), d = TC_I(p[4]);
    for (int64_t b = 0; b < bt; b++)
        for (int64_t h = 0; h < ht; h++)
            qk_pair(p, q + (b * sq * ht + h) * d, k + (b * sk * ht + h) * d, s + (b * ht + h) * sq * sk);
}

/* p: bt ht sq sk d alpha q0 k0 causal; bufs: q k s stats; attn_qk, then softmax_stats (beta 0) and
 * softmax_apply over the tile's rows, pair by pair while its scores are in cache (the tile holds whole
 * rows: its key tile is the only one its queries see). */
TC_KERNEL(attn_qk_softmax)
{
    const float *q = buf[0], *k = buf[1];
    float *s = buf[2], *st = buf[3];
    const int64_t bt = TC_I(p[0]), ht = TC_I(p[1]), sq = TC_I(p[2]), sk = TC_I(p[3]), d = TC_I(p[4]);
    for (int64_t b = 0; b < bt; b++)
        for (int64_t h = 0; h < ht; h++) {
            float *sbh = s + (b * ht + h) * sq * sk;
            qk_pair(p, q + (b * sq * ht + h) * d, k + (b * sk * ht + h) * d, sbh);
            tc_softmax_rows(sbh, st + (b * ht + h) * sq * 2, sq, sk);
        }
}

/* p: bt ht sq sk d alpha beta; bufs: p v o; O = alpha P V (+ O when beta != 0) */
TC_KERNEL(attn_pv)
{
    const float *pr = buf[0], *v = buf[1];
    float *o = buf[2];
    const int64_t bt = TC_I(p[0]), ht = TC_I(p[1]), sq = TC_I(p[2]), sk = TC_I(p[3]), d = TC_I(p[4]);
    const int ld = (int)(ht * d);
    const float beta = p[6] == 0.0 ? 0.0f : 1.0f;
    for (int64_t b = 0; b < bt; b++)
        for (int64_t h = 0; h < ht; h++)
            tc_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)sq, (int)d, (int)sk, (float)p[5],
                        pr + (b * ht + h) * sq * sk, (int)sk, v + (b * sk * ht + h) * d, ld, beta,
                        o + (b * sq * ht + h) * d, ld);
}

/* p: bt ht sq sk d alpha beta; bufs: p x y; Y = alpha P^T X (+ Y when beta != 0) */
TC_KERNEL(attn_ptv)
{
    const float *pr = buf[0], *x = buf[1];
    float *y = buf[2];
    const int64_t bt = TC_I(p[0]), ht = TC_I(p[1]), sq = TC_I(p[2]), sk = TC_I(p[3]), d = TC_I(p[4]);
    const int ld = (int)(ht * d);
    const float beta = p[6] == 0.0 ? 0.0f : 1.0f;
    for (int64_t b = 0; b < bt; b++)
        for (int64_t h = 0; h < ht; h++)
            tc_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)sk, (int)d, (int)sq, (float)p[5],
                        pr + (b * ht + h) * sq * sk, (int)sk, x + (b * sq * ht + h) * d, ld, beta,
                        y + (b * sk * ht + h) * d, ld);
}

/* p: bt sq ht dh; bufs: do o d; D[b, h, q] = sum over head_dim of dO * O */
TC_KERNEL(attn_rowdot)
{
    const float *dout = buf[0], *o = buf[1];
    float *dd = buf[2];
    const int64_t bt = TC_I(p[0]), sq = TC_I(p[1]), ht = TC_I(p[2]), dh = TC_I(p[3]);
    for (int64_t b = 0; b < bt; b++)
        for (int64_t i = 0; i < sq; i++)
            for (int64_t h = 0; h < ht; h++) {
                const int64_t off = ((b * sq + i) * ht + h) * dh;
                double s = 0.0;
                for (int64_t j = 0; j < dh; j++)
                    s += dout[off + j] * o[off + j];
                dd[(b * ht + h) * sq + i] = (float)s;
            }
}
