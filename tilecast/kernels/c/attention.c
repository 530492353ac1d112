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

/* Rows (attn_pv) or columns (attn_ptv) per block of a causal probability tile. */
#define PV_BLOCK 64

/* Entries of a causal tile that query row i keeps: key k0 + j <= query q0 + i, i.e. columns 0 .. kept - 1. */
static int64_t kept_cols(int64_t q0, int64_t k0, int64_t i, int64_t sk)
{
    const int64_t n = q0 + i - k0 + 1;
    return n < 0 ? 0 : n > sk ? sk : n;
}

static int64_t clip(int64_t v, int64_t hi)
{
    return v < 0 ? 0 : v > hi ? hi : v;
}

/* Zero rows of a (rows x d) block of a token-major tile (row stride ld). */
static void zero_rows(float *o, int64_t rows, int64_t d, int64_t ld)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < d; j++)
            o[r * ld + j] = 0.0f;
}

/* O (sq x d) = alpha P V + beta O for one (batch, head) pair; with causal, P's masked entries count as zero.
 * p: bt ht sq sk d alpha beta q0 k0 causal. A causal tile goes in blocks of PV_BLOCK query rows: the columns
 * every row of the block keeps are one product straight from P, the block's diagonal square (rows x at most
 * rows columns) a second product from a copy with its masked entries zeroed; masked columns cost nothing. */
static void pv_pair(const double *p, const float *pbh, const float *vbh, float *obh)
{
    const int64_t ht = TC_I(p[1]), sq = TC_I(p[2]), sk = TC_I(p[3]), d = TC_I(p[4]);
    const int64_t q0 = TC_I(p[7]), k0 = TC_I(p[8]);
    const int ld = (int)(ht * d);
    const float alpha = (float)p[5], beta = p[6] == 0.0 ? 0.0f : 1.0f;
    if (p[9] == 0.0 || kept_cols(q0, k0, 0, sk) == sk) {
        tc_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)sq, (int)d, (int)sk, alpha, pbh, (int)sk, vbh, ld,
                 beta, obh, ld);
        return;
    }
    float tri[PV_BLOCK * PV_BLOCK];
    for (int64_t i0 = 0; i0 < sq; i0 += PV_BLOCK) {
        const int64_t rows = sq - i0 > PV_BLOCK ? PV_BLOCK : sq - i0;
        const int64_t lo = clip(q0 + i0 - k0, sk), hi = kept_cols(q0, k0, i0 + rows - 1, sk);
        float b = beta;
        if (lo > 0) {
            tc_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)d, (int)lo, alpha, pbh + i0 * sk,
                     (int)sk, vbh, ld, b, obh + i0 * ld, ld);
            b = 1.0f;
        }
        if (hi > lo) {
            const int64_t w = hi - lo; /* at most rows */
            for (int64_t r = 0; r < rows; r++) {
                const int64_t keep = kept_cols(q0, k0, i0 + r, sk) - lo;
                const float *src = pbh + (i0 + r) * sk + lo;
                for (int64_t c = 0; c < w; c++)
                    tri[r * w + c] = c < keep ? src[c] : 0.0f;
            }
            tc_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)d, (int)w, alpha, tri, (int)w,
                     vbh + lo * ld, ld, b, obh + i0 * ld, ld);
            b = 1.0f;
        }
        if (b == 0.0f)
            zero_rows(obh + i0 * ld, rows, d, ld);
    }
}

/* Y (sk x d) = alpha P^T X + beta Y for one (batch, head) pair; with causal, P's masked entries count as zero.
 * p: bt ht sq sk d alpha beta q0 k0 causal. A causal tile goes in blocks of PV_BLOCK key columns: the query
 * rows that keep every column of the block are one product straight from P, the block's diagonal square a
 * second product from a copy with its masked entries zeroed; rows that keep none of the block cost nothing. */
static void ptv_pair(const double *p, const float *pbh, const float *xbh, float *ybh)
{
    const int64_t ht = TC_I(p[1]), sq = TC_I(p[2]), sk = TC_I(p[3]), d = TC_I(p[4]);
    const int64_t q0 = TC_I(p[7]), k0 = TC_I(p[8]);
    const int ld = (int)(ht * d);
    const float alpha = (float)p[5], beta = p[6] == 0.0 ? 0.0f : 1.0f;
    if (p[9] == 0.0 || kept_cols(q0, k0, 0, sk) == sk) {
        tc_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)sk, (int)d, (int)sq, alpha, pbh, (int)sk, xbh, ld,
                 beta, ybh, ld);
        return;
    }
    float tri[PV_BLOCK * PV_BLOCK];
    for (int64_t j0 = 0; j0 < sk; j0 += PV_BLOCK) {
        const int64_t cols = sk - j0 > PV_BLOCK ? PV_BLOCK : sk - j0;
        /* query row i keeps key column j when i >= j + k0 - q0 */
        const int64_t lo = clip(j0 + k0 - q0, sq), hi = clip(j0 + cols - 1 + k0 - q0, sq);
        float b = beta;
        if (hi < sq) {
            tc_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)cols, (int)d, (int)(sq - hi), alpha,
                     pbh + hi * sk + j0, (int)sk, xbh + hi * ld, ld, b, ybh + j0 * ld, ld);
            b = 1.0f;
        }
        if (hi > lo) {
            const int64_t h = hi - lo; /* at most cols - 1 */
            for (int64_t r = 0; r < h; r++) {
                const int64_t keep = kept_cols(q0, k0, lo + r, sk) - j0; /* columns j0 .. j0 + keep - 1 */
                const float *src = pbh + (lo + r) * sk + j0;
                for (int64_t c = 0; c < cols; c++)
                    tri[r * cols + c] = c < keep ? src[c] : 0.0f;
            }
            tc_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)cols, (int)d, (int)h, alpha, tri, (int)cols,
                     xbh + lo * ld, ld, b, ybh + j0 * ld, ld);
            b = 1.0f;
        }
        if (b == 0.0f)
            zero_rows(ybh + j0 * ld, cols, d, ld);
    }
}

/* p: bt ht sq sk d alpha beta q0 k0 causal; bufs: p v o; O = alpha P V (+ O when beta != 0) */
TC_KERNEL(attn_pv)
{
    const float *pr = buf[0], *v = buf[1];
    float *o = buf[2];
    const int64_t bt = TC_I(p[0]), ht = TC_I(p[1]), sq = TC_I(p[2]), sk = TC_I(p[3]), d = TC_I(p[4]);
    for (int64_t b = 0; b < bt; b++)
        for (int64_t h = 0; h < ht; h++)
            pv_pair(p, pr + (b * ht + h) * sq * sk, v + (b * sk * ht + h) * d, o + (b * sq * ht + h) * d);
}

/* p: bt ht sq sk d alpha beta q0 k0 causal; bufs: p x y; Y = alpha P^T X (+ Y when beta != 0) */
TC_KERNEL(attn_ptv)
{
    const float *pr = buf[0], *x = buf[1];
    float *y = buf[2];
    const int64_t bt = TC_I(p[0]), ht = TC_I(p[1]), sq = TC_I(p[2]), sk = TC_I(p[3]), d = TC_I(p[4]);
    for (int64_t b = 0; b < bt; b++)
        for (int64_t h = 0; h < ht; h++)
            ptv_pair(p, pr + (b * ht + h) * sq * sk, x + (b * sq * ht + h) * d, y + (b * sk * ht + h) * d);
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
                /* 8 independent double accumulators: a single one is a chain of dependent additions */
                double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                int64_t j = 0;
                for (; j + 8 <= dh; j += 8)
                    for (int l = 0; l < 8; l++)
                        acc[l] += dout[off + j + l] * o[off + j + l];
                double s = 0.0;
                for (; j < dh; j++)
                    s += dout[off + j] * o[off + j];
                for (int l = 0; l < 8; l++)
                    s += acc[l];
                dd[(b * ht + h) * sq + i] = (float)s;
            }
}
