/* AVX2 micro-kernels: a tile of up to 6 rows x 16 columns in 12 ymm
 * accumulators, run once per half of the 32-wide weight panel (the half is
 * read with a stride of 32 elements per k step).  Compiled for avx2 + fma +
 * f16c and only called after the runtime CPU check in matmul.c. */
#include "engine/cpu/matmul_internal.h"

#if DUET__MM_X86

#include <immintrin.h>
#include <stdint.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#define DUET__MR256 6

#define DUET__INLINE static inline __attribute__((always_inline))

DUET__INLINE void duet__b_load(const int dt, const void *b, size_t off, __m256 *b0, __m256 *b1)
{
    if (dt == DUET_DTYPE_F32) {
        const float *p = (const float *)b + off;
        *b0 = _mm256_load_ps(p);
        *b1 = _mm256_load_ps(p + 8);
    } else if (dt == DUET_DTYPE_F16) {
        const uint16_t *p = (const uint16_t *)b + off;
        *b0 = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)p));
        *b1 = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(p + 8)));
    } else {
        const uint16_t *p = (const uint16_t *)b + off;
        __m256i lo = _mm256_cvtepu16_epi32(_mm_load_si128((const __m128i *)p));
        __m256i hi = _mm256_cvtepu16_epi32(_mm_load_si128((const __m128i *)(p + 8)));
        *b0 = _mm256_castsi256_ps(_mm256_slli_epi32(lo, 16));
        *b1 = _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16));
    }
}

/* Lanes [0, valid) set, for maskload/maskstore. */
DUET__INLINE __m256i duet__lanes(int valid)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* 16 columns starting at column h of the panel; nc16 in [1, 16] are stored. */
DUET__INLINE void duet__tile(const int mr, const int dt, int kc, const float *a, const void *b,
                             int h, float *c, size_t ldc, int nc16, const float *bias,
                             unsigned flags, const char *pf)
{
    __m256 c0[DUET__MR256], c1[DUET__MR256];
    const int full = nc16 == 16;
    const __m256i m0 = duet__lanes(nc16), m1 = duet__lanes(nc16 - 8);

    if (flags & DUET__MM_ACCUM) {
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            if (full) {
                c0[r] = _mm256_loadu_ps(c + (size_t)r * ldc);
                c1[r] = _mm256_loadu_ps(c + (size_t)r * ldc + 8);
            } else {
                c0[r] = _mm256_maskload_ps(c + (size_t)r * ldc, m0);
                c1[r] = _mm256_maskload_ps(c + (size_t)r * ldc + 8, m1);
            }
        }
    } else {
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            c0[r] = _mm256_setzero_ps();
            c1[r] = _mm256_setzero_ps();
        }
    }
    for (int kk = 0; kk < kc; kk++) {
        __m256 b0, b1;
        _mm_prefetch(pf + (size_t)kk * 64, _MM_HINT_T1);
        duet__b_load(dt, b, (size_t)kk * DUET__MM_NR + h, &b0, &b1);
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            __m256 av = _mm256_broadcast_ss(a + r * DUET__MM_LDA + kk);
            c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
            c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
        }
    }
    if (bias != NULL) {
        __m256 bias0 = _mm256_maskload_ps(bias, m0);
        __m256 bias1 = _mm256_maskload_ps(bias + 8, m1);
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            c0[r] = _mm256_add_ps(c0[r], bias0);
            c1[r] = _mm256_add_ps(c1[r], bias1);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++) {
        if (full) {
            _mm256_storeu_ps(c + (size_t)r * ldc, c0[r]);
            _mm256_storeu_ps(c + (size_t)r * ldc + 8, c1[r]);
        } else {
            _mm256_maskstore_ps(c + (size_t)r * ldc, m0, c0[r]);
            _mm256_maskstore_ps(c + (size_t)r * ldc + 8, m1, c1[r]);
        }
    }
}

DUET__INLINE void duet__tile32(const int mr, const int dt, int kc, const float *a, const void *b,
                               float *c, size_t ldc, int nc, const float *bias, unsigned flags,
                               const char *pf)
{
    duet__tile(mr, dt, kc, a, b, 0, c, ldc, nc < 16 ? nc : 16, bias, flags, pf);
    if (nc > 16)
        duet__tile(mr, dt, kc, a, b, 16, c + 16, ldc, nc - 16, bias != NULL ? bias + 16 : NULL,
                   flags, pf); /* the same lines again: already on their way, cheap */
}

/* A whole 32-column panel for tiles of 1-2 rows (8 accumulators): more
 * independent FMA chains than the 16-column tile has with so few rows. */
DUET__INLINE void duet__tile_panel(const int mr, const int dt, int kc, const float *a,
                                   const void *b, float *c, size_t ldc, int nc, const float *bias,
                                   unsigned flags, const char *pf)
{
    const size_t step = dt == DUET_DTYPE_F32 ? 128 : 64; /* bytes of one k step */
    __m256 acc[2][4];
    __m256i mk[4];

    for (int v = 0; v < 4; v++)
        mk[v] = duet__lanes(nc - 8 * v);
#pragma GCC unroll 2
    for (int r = 0; r < mr; r++) {
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++)
            acc[r][v] = (flags & DUET__MM_ACCUM)
                            ? _mm256_maskload_ps(c + (size_t)r * ldc + 8 * v, mk[v])
                            : _mm256_setzero_ps();
    }
    for (int kk = 0; kk < kc; kk++) {
        __m256 bv[4];
        _mm_prefetch(pf + kk * step, _MM_HINT_T1);
        if (step == 128)
            _mm_prefetch(pf + kk * step + 64, _MM_HINT_T1);
        duet__b_load(dt, b, (size_t)kk * DUET__MM_NR, &bv[0], &bv[1]);
        duet__b_load(dt, b, (size_t)kk * DUET__MM_NR + 16, &bv[2], &bv[3]);
#pragma GCC unroll 2
        for (int r = 0; r < mr; r++) {
            __m256 av = _mm256_broadcast_ss(a + r * DUET__MM_LDA + kk);
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++)
                acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
    if (bias != NULL) {
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            __m256 bb = _mm256_maskload_ps(bias + 8 * v, mk[v]);
#pragma GCC unroll 2
            for (int r = 0; r < mr; r++)
                acc[r][v] = _mm256_add_ps(acc[r][v], bb);
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < mr; r++) {
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++)
            _mm256_maskstore_ps(c + (size_t)r * ldc + 8 * v, mk[v], acc[r][v]);
    }
}

/* kernel2 contract (two panels) by running each panel as one tile. */
#define DUET__KERNEL2(fname, DT)                                                                   \
    static void fname(int mr, int kc, const float *a, const void *b, const void *b2, float *c,     \
                      size_t ldc, int nc, const float *bias, unsigned flags, const char *pf,       \
                      const char *pf2)                                                             \
    {                                                                                              \
        int nc1 = nc < DUET__MM_NR ? nc : DUET__MM_NR;                                             \
        const float *bias2 = bias != NULL ? bias + DUET__MM_NR : NULL;                             \
        if (mr == 1) {                                                                             \
            duet__tile_panel(1, DT, kc, a, b, c, ldc, nc1, bias, flags, pf);                       \
            if (nc > DUET__MM_NR)                                                                  \
                duet__tile_panel(1, DT, kc, a, b2, c + DUET__MM_NR, ldc, nc - DUET__MM_NR, bias2,  \
                                 flags, pf2);                                                      \
        } else {                                                                                   \
            duet__tile_panel(2, DT, kc, a, b, c, ldc, nc1, bias, flags, pf);                       \
            if (nc > DUET__MM_NR)                                                                  \
                duet__tile_panel(2, DT, kc, a, b2, c + DUET__MM_NR, ldc, nc - DUET__MM_NR, bias2,  \
                                 flags, pf2);                                                      \
        }                                                                                          \
    }

DUET__KERNEL2(duet__kernel2_f32, DUET_DTYPE_F32)
DUET__KERNEL2(duet__kernel2_f16, DUET_DTYPE_F16)
DUET__KERNEL2(duet__kernel2_bf16, DUET_DTYPE_BF16)

#define DUET__TILE_CASE(MR, DT)                                                                    \
    case MR:                                                                                       \
        duet__tile32(MR, DT, kc, a, b, c, ldc, nc, bias, flags, pf);                               \
        break;

#define DUET__KERNEL(fname, DT)                                                                    \
    static void fname(int mr, int kc, const float *a, const void *b, float *c, size_t ldc, int nc, \
                      const float *bias, unsigned flags, const char *pf)                           \
    {                                                                                              \
        switch (mr) {                                                                              \
            DUET__TILE_CASE(1, DT)                                                                 \
            DUET__TILE_CASE(2, DT)                                                                 \
            DUET__TILE_CASE(3, DT)                                                                 \
            DUET__TILE_CASE(4, DT)                                                                 \
            DUET__TILE_CASE(5, DT)                                                                 \
            DUET__TILE_CASE(6, DT)                                                                 \
        default:                                                                                   \
            __builtin_unreachable();                                                               \
        }                                                                                          \
    }

DUET__KERNEL(duet__kernel_f32, DUET_DTYPE_F32)
DUET__KERNEL(duet__kernel_f16, DUET_DTYPE_F16)
DUET__KERNEL(duet__kernel_bf16, DUET_DTYPE_BF16)

static void duet__widen_f16(const void *src, float *dst, size_t n)
{
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i += 8)
        _mm256_store_ps(dst + i, _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(s + i))));
}

static void duet__widen_bf16(const void *src, float *dst, size_t n)
{
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_load_si128((const __m128i *)(s + i)));
        _mm256_store_si256((__m256i *)(dst + i), _mm256_slli_epi32(v, 16));
    }
}

#pragma GCC pop_options

const duet__mm_ops_t duet__mm_ops_avx2 = {
    .name = "avx2",
    .mr = DUET__MR256,
    .kernel = {duet__kernel_f32, duet__kernel_f16, duet__kernel_bf16},
    .mr2 = 2,
    .kernel2 = {duet__kernel2_f32, duet__kernel2_f16, duet__kernel2_bf16},
    .widen = {NULL, duet__widen_f16, duet__widen_bf16},
    .widen_min_tiles = 3,
};

#else

typedef int duet__mm_avx2_unavailable_t; /* ISO C wants a non-empty file */

#endif
