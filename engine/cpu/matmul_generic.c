/* Portable C micro-kernel: a tile of up to 4 rows x 32 columns, multiply
 * then add (no FMA contraction in ISO C mode, so results differ from the SIMD
 * kernels by rounding).  F16/BF16 weight blocks are always widened to f32
 * first (widen_min_tiles = 1).  Used where neither AVX2 nor AVX-512 is
 * available. */
#include "engine/cpu/matmul_internal.h"

#include <stdint.h>

#define DUET__MRG 4

static inline __attribute__((always_inline)) void duet__tile(const int mr, int kc, const float *a,
                                                             const float *b, float *c, size_t ldc,
                                                             int nc, const float *bias,
                                                             unsigned flags)
{
    float acc[DUET__MRG][DUET__MM_NR];

    for (int r = 0; r < mr; r++) {
        for (int jj = 0; jj < DUET__MM_NR; jj++)
            acc[r][jj] = (flags & DUET__MM_ACCUM) && jj < nc ? c[(size_t)r * ldc + jj] : 0.0f;
    }
    for (int kk = 0; kk < kc; kk++) {
        const float *bk = b + (size_t)kk * DUET__MM_NR;
        for (int r = 0; r < mr; r++) {
            float av = a[r * DUET__MM_LDA + kk];
            for (int jj = 0; jj < DUET__MM_NR; jj++)
                acc[r][jj] += av * bk[jj];
        }
    }
    for (int r = 0; r < mr; r++) {
        for (int jj = 0; jj < nc; jj++)
            c[(size_t)r * ldc + jj] = bias != NULL ? acc[r][jj] + bias[jj] : acc[r][jj];
    }
}

static void duet__kernel_f32(int mr, int kc, const float *a, const void *b, float *c, size_t ldc,
                             int nc, const float *bias, unsigned flags, const char *pf)
{
    (void)pf; /* left to the hardware prefetcher */
    switch (mr) {
    case 1:
        duet__tile(1, kc, a, b, c, ldc, nc, bias, flags);
        break;
    case 2:
        duet__tile(2, kc, a, b, c, ldc, nc, bias, flags);
        break;
    case 3:
        duet__tile(3, kc, a, b, c, ldc, nc, bias, flags);
        break;
    default:
        duet__tile(4, kc, a, b, c, ldc, nc, bias, flags);
        break;
    }
}

static void duet__widen_f16(const void *src, float *dst, size_t n)
{
    duet_dtype_to_f32(DUET_DTYPE_F16, src, dst, n);
}

static void duet__widen_bf16(const void *src, float *dst, size_t n)
{
    duet_dtype_to_f32(DUET_DTYPE_BF16, src, dst, n);
}

const duet__mm_ops_t duet__mm_ops_generic = {
    .name = "generic",
    .mr = DUET__MRG,
    .kernel = {duet__kernel_f32, NULL, NULL},
    .widen = {NULL, duet__widen_f16, duet__widen_bf16},
    .widen_min_tiles = 1,
};
