/* General matrix multiply on tiles viewed as row-major matrices (CBLAS). */
#include "tc_blas.h"
#include "tilecast_kernels.h"

/* p: trans_a trans_b m n k alpha beta; C (m x n) = alpha op(A) op(B) + beta C. */
TC_KERNEL(gemm)
{
    const int ta = p[0] != 0.0, tb = p[1] != 0.0;
    const int m = (int)p[2], n = (int)p[3], k = (int)p[4];
    const float alpha = (float)p[5], beta = (float)p[6];
    if (m == 0 || n == 0)
        return;
    tc_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                m, n, k, alpha, (const float *)buf[0], ta ? m : k, (const float *)buf[1], tb ? k : n,
                beta, (float *)buf[2], n);
}
