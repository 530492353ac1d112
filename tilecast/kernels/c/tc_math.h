/* exp and tanh in float32 written so that GCC vectorises the loops that call
 * them (glibc's expf/tanhf are scalar calls).
 *
 * Loops calling them vectorise when compiled with -O3 -fno-trapping-math
 * -fno-math-errno (flags that change no result, unlike -ffast-math).
 *
 * tc_expf: range reduction x = n ln2 + r and the degree-6 polynomial of
 * Cephes' expf (S. L. Moshier, Cephes Mathematical Library, expf.c), relative
 * error about 1e-7 (evaluated with fused multiply-adds); exp(-inf) = 0, exp(+inf) = inf, NaN stays NaN; results
 * that would be subnormal (x < -87.33) are flushed to 0.
 *
 * tc_expf_nonpos: tc_expf for x below 88.37 (exp(s - max)), cheaper.
 *
 * tc_sum_exp: sum of exp(x[j] - shift) in 16 independent float accumulators
 * (a single-accumulator reduction is not vectorised without reassociation),
 * added up in double: each lane adds n/16 terms, as numpy's pairwise float32
 * sum adds blocks of 8.
 *
 * tc_max_nan: the largest of x[0..n) and whether any is NaN, in 16 independent
 * lanes for the same reason (the maximum does not depend on the order), written
 * with GCC/Clang vector extensions: GCC does not vectorise a max reduction
 * written with selects, nor lanes of selects kept in an array.
 *
 * tc_tanhf: the odd Taylor polynomial to x^7 for |x| < 0.0625 (error below
 * 1e-11 relative), else 1 - 2 / (exp(2|x|) + 1) with the sign of x.
 */
#ifndef TC_MATH_H
#define TC_MATH_H

#include <stdint.h>
#include <math.h>
#include <string.h>

static inline float tc_pow2i(int32_t n)
{
    union {
        int32_t i;
        float f;
    } u = {.i = (n + 127) << 23};
    return u.f;
}

/* a * b + c, fused where the CPU has FMA (one rounding), else as written (a libm fmaf would not vectorise). */
#if defined(__FMA__) || defined(__aarch64__)
#define TC_FMA(a, b, c) fmaf((a), (b), (c))
#else
#define TC_FMA(a, b, c) ((a) * (b) + (c))
#endif

/* exp(xc) / 2^n for n = round(xc / ln 2): Cody-Waite reduction and the degree-7 polynomial that
 * tc_expf and tc_expf_nonpos share (the same operations, so the same bits in both). */
static inline float tc_exp_mantissa(float xc, float n)
{
    float r = TC_FMA(n, -0.693359375f, xc);
    r = TC_FMA(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = TC_FMA(p, r, 1.3981999507e-3f);
    p = TC_FMA(p, r, 8.3334519073e-3f);
    p = TC_FMA(p, r, 4.1665795894e-2f);
    p = TC_FMA(p, r, 1.6666665459e-1f);
    p = TC_FMA(p, r, 5.0000001201e-1f);
    p = TC_FMA(p * r, r, r) + 1.0f;
    return p;
}

static inline float tc_expf(float x)
{
    float xc = x > 88.72283935546875f ? 88.72283935546875f : x;
    xc = xc < -87.33654022216797f ? -87.33654022216797f : xc;
    /* Fused multiply-adds where the CPU has them, written out (the kernels build with
     * -ffp-contract=off): 10 fewer vector instructions of about 40 per 16 floats, 1.22x on a sum
     * of exponentials, the same error bound. */
    const float n = floorf(TC_FMA(xc, 1.44269504088896341f, 0.5f)); /* inlined with -fno-trapping-math */
    const float p = tc_exp_mantissa(xc, n);
    const int32_t ni = (int32_t)n, n1 = ni >> 1; /* 2^n as 2^n1 2^(n - n1): 2^128 is not a float */
    float y = p * tc_pow2i(n1) * tc_pow2i(ni - n1);
    y = x > 88.72283935546875f ? INFINITY : y;
    y = x < -87.33654022216797f ? 0.0f : y;
    return x != x ? x : y;
}

/* tc_expf without its overflow side, for x below 88.37 (2^n then a normal float, n >= -126) or NaN: the
 * same bits as tc_expf there, 2^n in one step, a third fewer instructions (1.47x on a sum of
 * exponentials). For exp(s - m) with m a finite maximum of the s (softmax statistics, the cross-entropy
 * gradient); larger x give wrong results. */
static inline float tc_expf_nonpos(float x)
{
    const float xc = x < -87.33654022216797f ? -87.33654022216797f : x;
    const float n = floorf(TC_FMA(xc, 1.44269504088896341f, 0.5f));
    const float p = tc_exp_mantissa(xc, n);
    const float y = p * tc_pow2i((int32_t)n);
    return x < -87.33654022216797f ? 0.0f : y;
}

static inline float tc_tanhf(float x)
{
    const float a = fabsf(x);
    const float x2 = x * x;
    const float small = x * (1.0f + x2 * (-0.333333333333f + x2 * (0.133333333333f + x2 * -0.053968253968f)));
    /* From |x| = 10 on (NaN and infinities included) 1 - 2 / (exp(2|x|) + 1) rounds to 1: clamped there, the
     * exponential cannot overflow (tc_expf_nonpos, the same bits). */
    const float big = 1.0f - 2.0f / (tc_expf_nonpos(2.0f * (a < 10.0f ? a : 10.0f)) + 1.0f);
    const float t = a < 0.0625f ? small : copysignf(big, x);
    return x != x ? x : t;
}

#define TC_SUM_EXP(name, expf_fn)                                                                             \
    static inline double name(const float *x, int64_t n, float shift)                                         \
    {                                                                                                         \
        float acc[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};                                     \
        int64_t j = 0;                                                                                        \
        for (; j + 16 <= n; j += 16)                                                                          \
            for (int l = 0; l < 16; l++)                                                                      \
                acc[l] += expf_fn(x[j + l] - shift);                                                          \
        double s = 0.0;                                                                                       \
        for (; j < n; j++)                                                                                    \
            s += expf_fn(x[j] - shift);                                                                       \
        for (int l = 0; l < 16; l++)                                                                          \
            s += acc[l];                                                                                      \
        return s;                                                                                             \
    }
TC_SUM_EXP(tc_sum_exp, tc_expf)
/* The same sum when shift is finite and no x[j] exceeds it: the same bits, faster. */
TC_SUM_EXP(tc_sum_exp_below, tc_expf_nonpos)

typedef float tc_v8f __attribute__((vector_size(32)));
typedef int32_t tc_v8i __attribute__((vector_size(32)));

static inline float tc_max_nan(const float *x, int64_t n, int *has_nan)
{
    const float ninf = -INFINITY;
    tc_v8f lane0 = {ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf}, lane1 = lane0;
    tc_v8i bad = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        tc_v8f v0, v1;
        memcpy(&v0, x + j, sizeof v0);
        memcpy(&v1, x + j + 8, sizeof v1);
        const tc_v8i gt0 = v0 > lane0, gt1 = v1 > lane1;
        lane0 = (tc_v8f)(((tc_v8i)v0 & gt0) | ((tc_v8i)lane0 & ~gt0));
        lane1 = (tc_v8f)(((tc_v8i)v1 & gt1) | ((tc_v8i)lane1 & ~gt1));
        bad |= (v0 != v0) | (v1 != v1);
    }
    float m = -INFINITY;
    int32_t nan = 0;
    for (; j < n; j++) {
        m = x[j] > m ? x[j] : m;
        nan |= x[j] != x[j];
    }
    for (int l = 0; l < 8; l++) {
        m = lane0[l] > m ? lane0[l] : m;
        m = lane1[l] > m ? lane1[l] : m;
        nan |= bad[l];
    }
    *has_nan = nan != 0;
    return m;
}

#endif
