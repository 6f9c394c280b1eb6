/* AVX-512 micro-kernels: a tile of up to 14 rows x 32 columns held in 28
 * zmm accumulators; per k step two weight vectors (loaded, or widened from
 * F16 with vcvtph2ps / from BF16 with a shift) and one broadcast FMA pair
 * per row.  Compiled for avx512f/bw/vl + fma + f16c and only called after
 * the runtime CPU check in matmul.c. */
#include "engine/cpu/matmul_internal.h"

#if DUET__MM_X86

#include <immintrin.h>
#include <stdint.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")

#define DUET__MR512 14

#define DUET__INLINE static inline __attribute__((always_inline))

DUET__INLINE void duet__b_load(const int dt, const void *b, int kk, __m512 *b0, __m512 *b1)
{
    if (dt == DUET_DTYPE_F32) {
        const float *p = (const float *)b + (size_t)kk * DUET__MM_NR;
        *b0 = _mm512_load_ps(p);
        *b1 = _mm512_load_ps(p + 16);
    } else if (dt == DUET_DTYPE_F16) {
        const uint16_t *p = (const uint16_t *)b + (size_t)kk * DUET__MM_NR;
        *b0 = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)p));
        *b1 = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(p + 16)));
    } else {
        const uint16_t *p = (const uint16_t *)b + (size_t)kk * DUET__MM_NR;
        __m512i lo = _mm512_cvtepu16_epi32(_mm256_load_si256((const __m256i *)p));
        __m512i hi = _mm512_cvtepu16_epi32(_mm256_load_si256((const __m256i *)(p + 16)));
        *b0 = _mm512_castsi512_ps(_mm512_slli_epi32(lo, 16));
        *b1 = _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16));
    }
}

DUET__INLINE void duet__tile(const int mr, const int dt, int kc, const float *a, const void *b,
                             float *c, size_t ldc, int nc, const float *bias, unsigned flags,
                             const char *pf)
{
    __m512 c0[DUET__MR512], c1[DUET__MR512];
    __mmask16 m0 = (__mmask16)(nc >= 16 ? 0xffff : (1u << nc) - 1);
    __mmask16 m1 = (__mmask16)(nc >= 32 ? 0xffff : nc <= 16 ? 0 : (1u << (nc - 16)) - 1);

    if (flags & DUET__MM_ACCUM) {
#pragma GCC unroll 14
        for (int r = 0; r < mr; r++) {
            c0[r] = _mm512_maskz_loadu_ps(m0, c + (size_t)r * ldc);
            c1[r] = _mm512_maskz_loadu_ps(m1, c + (size_t)r * ldc + 16);
        }
    } else {
#pragma GCC unroll 14
        for (int r = 0; r < mr; r++) {
            c0[r] = _mm512_setzero_ps();
            c1[r] = _mm512_setzero_ps();
        }
    }
    for (int kk = 0; kk < kc; kk++) {
        __m512 b0, b1;
        _mm_prefetch(pf + (size_t)kk * 64, _MM_HINT_T1);
        duet__b_load(dt, b, kk, &b0, &b1);
#pragma GCC unroll 14
        for (int r = 0; r < mr; r++) {
            __m512 av = _mm512_set1_ps(a[r * DUET__MM_LDA + kk]);
            c0[r] = _mm512_fmadd_ps(av, b0, c0[r]);
            c1[r] = _mm512_fmadd_ps(av, b1, c1[r]);
        }
    }
    if (bias != NULL) {
        __m512 bias0 = _mm512_maskz_loadu_ps(m0, bias);
        __m512 bias1 = _mm512_maskz_loadu_ps(m1, bias + 16);
#pragma GCC unroll 14
        for (int r = 0; r < mr; r++) {
            c0[r] = _mm512_add_ps(c0[r], bias0);
            c1[r] = _mm512_add_ps(c1[r], bias1);
        }
    }
#pragma GCC unroll 14
    for (int r = 0; r < mr; r++) {
        _mm512_mask_storeu_ps(c + (size_t)r * ldc, m0, c0[r]);
        _mm512_mask_storeu_ps(c + (size_t)r * ldc + 16, m1, c1[r]);
    }
}

/* Two adjacent panels (64 columns) for tiles of at most 6 rows: with few
 * rows a 32-column tile has too few independent FMA chains to cover the
 * FMA latency.  b2 is the second panel's block, c columns 32.. are its. */
DUET__INLINE void duet__tile2(const int mr, const int dt, int kc, const float *a, const void *b,
                              const void *b2, float *c, size_t ldc, int nc, const float *bias,
                              unsigned flags, const char *pf, const char *pf2)
{
    const size_t step = dt == DUET_DTYPE_F32 ? 128 : 64; /* bytes of one k step */
    __m512 acc[6][4];
    __mmask16 mk[4];

    for (int v = 0; v < 4; v++) {
        int left = nc - 16 * v;
        mk[v] = (__mmask16)(left >= 16 ? 0xffff : left <= 0 ? 0 : (1u << left) - 1);
    }
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++) {
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++)
            acc[r][v] = (flags & DUET__MM_ACCUM)
                            ? _mm512_maskz_loadu_ps(mk[v], c + (size_t)r * ldc + 16 * v)
                            : _mm512_setzero_ps();
    }
    for (int kk = 0; kk < kc; kk++) {
        __m512 bv[4];
        _mm_prefetch(pf + kk * step, _MM_HINT_T1);
        _mm_prefetch(pf2 + kk * step, _MM_HINT_T1);
        if (step == 128) {
            _mm_prefetch(pf + kk * step + 64, _MM_HINT_T1);
            _mm_prefetch(pf2 + kk * step + 64, _MM_HINT_T1);
        }
        duet__b_load(dt, b, kk, &bv[0], &bv[1]);
        duet__b_load(dt, b2, kk, &bv[2], &bv[3]);
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            __m512 av = _mm512_set1_ps(a[r * DUET__MM_LDA + kk]);
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++)
                acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
    if (bias != NULL) {
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            __m512 bb = _mm512_maskz_loadu_ps(mk[v], bias + 16 * v);
#pragma GCC unroll 6
            for (int r = 0; r < mr; r++)
                acc[r][v] = _mm512_add_ps(acc[r][v], bb);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++) {
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++)
            _mm512_mask_storeu_ps(c + (size_t)r * ldc + 16 * v, mk[v], acc[r][v]);
    }
}

#define DUET__TILE2_CASE(MR, DT)                                                                   \
    case MR:                                                                                       \
        duet__tile2(MR, DT, kc, a, b, b2, c, ldc, nc, bias, flags, pf, pf2);                       \
        break;

#define DUET__KERNEL2(fname, DT)                                                                   \
    static void fname(int mr, int kc, const float *a, const void *b, const void *b2, float *c,     \
                      size_t ldc, int nc, const float *bias, unsigned flags, const char *pf,       \
                      const char *pf2)                                                             \
    {                                                                                              \
        switch (mr) {                                                                              \
            DUET__TILE2_CASE(1, DT)                                                                \
            DUET__TILE2_CASE(2, DT)                                                                \
            DUET__TILE2_CASE(3, DT)                                                                \
            DUET__TILE2_CASE(4, DT)                                                                \
            DUET__TILE2_CASE(5, DT)                                                                \
            DUET__TILE2_CASE(6, DT)                                                                \
        default:                                                                                   \
            __builtin_unreachable();                                                               \
        }                                                                                          \
    }

DUET__KERNEL2(duet__kernel2_f32, DUET_DTYPE_F32)
DUET__KERNEL2(duet__kernel2_f16, DUET_DTYPE_F16)
DUET__KERNEL2(duet__kernel2_bf16, DUET_DTYPE_BF16)

#define DUET__TILE_CASE(MR, DT)                                                                    \
    case MR:                                                                                       \
        duet__tile(MR, DT, kc, a, b, c, ldc, nc, bias, flags, pf);                                 \
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
            DUET__TILE_CASE(7, DT)                                                                 \
            DUET__TILE_CASE(8, DT)                                                                 \
            DUET__TILE_CASE(9, DT)                                                                 \
            DUET__TILE_CASE(10, DT)                                                                \
            DUET__TILE_CASE(11, DT)                                                                \
            DUET__TILE_CASE(12, DT)                                                                \
            DUET__TILE_CASE(13, DT)                                                                \
            DUET__TILE_CASE(14, DT)                                                                \
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
    for (size_t i = 0; i < n; i += 16)
        _mm512_store_ps(dst + i, _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(s + i))));
}

static void duet__widen_bf16(const void *src, float *dst, size_t n)
{
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i += 16) {
        __m512i v = _mm512_cvtepu16_epi32(_mm256_load_si256((const __m256i *)(s + i)));
        _mm512_store_si512((void *)(dst + i), _mm512_slli_epi32(v, 16));
    }
}

#pragma GCC pop_options

const duet__mm_ops_t duet__mm_ops_avx512 = {
    .name = "avx512",
    .mr = DUET__MR512,
    .kernel = {duet__kernel_f32, duet__kernel_f16, duet__kernel_bf16},
    .mr2 = 6,
    .kernel2 = {duet__kernel2_f32, duet__kernel2_f16, duet__kernel2_bf16},
    .widen = {NULL, duet__widen_f16, duet__widen_bf16},
    .widen_min_tiles = 3,
};

#else

typedef int duet__mm_avx512_unavailable_t; /* ISO C wants a non-empty file */

#endif
