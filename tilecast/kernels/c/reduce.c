/* Column reductions shared by several kernels, accumulated in double over
 * blocks of columns so that rows are read contiguously. */
#include "tilecast_kernels.h"

#define BLOCK 256

void tc_colsum(const float *x, int64_t rows, int64_t cols, float *out, int accumulate)
{
    double acc[BLOCK];
    for (int64_t c0 = 0; c0 < cols; c0 += BLOCK) {
        const int64_t w = cols - c0 < BLOCK ? cols - c0 : BLOCK;
        for (int64_t j = 0; j < w; j++)
            acc[j] = 0.0;
        for (int64_t r = 0; r < rows; r++) {
            const float *row = x + r * cols + c0;
            for (int64_t j = 0; j < w; j++)
                acc[j] += row[j];
        }
        for (int64_t j = 0; j < w; j++)
            out[c0 + j] = accumulate ? out[c0 + j] + (float)acc[j] : (float)acc[j];
    }
}
