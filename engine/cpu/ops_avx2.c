/* AVX2 instantiation of the cpu backend's non-matmul kernels
 * (ops_simd.inc): 8 lanes, attention tiles of 2 row vectors x 4 keys/dims
 * (16 ymm registers leave room for 8 accumulators).  Compiled for
 * avx2 + fma + f16c and only used after the runtime CPU check in ops.c. */
#include "engine/cpu/ops_internal.h"

#if DUET__MM_X86

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#define DUET__W      8
#define DUET__CT     2
#define DUET__JT     4
#define DUET__DT     4
#define DUET__SR     4
#define DUET__DV     2
#define DUET__SFX(x) duet__##x##_avx2
#define DUET__NAME   "avx2"
#define DUET__KERNEL

typedef __m256 v_t;
typedef __m256 m_t;

#define DUET__V static inline __attribute__((always_inline))

DUET__V __m256i duet__v_mask_n(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
DUET__V v_t duet__v_zero(void)
{
    return _mm256_setzero_ps();
}
DUET__V v_t duet__v_set1(float x)
{
    return _mm256_set1_ps(x);
}
DUET__V v_t duet__v_load(const float *p)
{
    return _mm256_loadu_ps(p);
}
DUET__V void duet__v_store(float *p, v_t v)
{
    _mm256_storeu_ps(p, v);
}
DUET__V v_t duet__v_load_n(const float *p, int n)
{
    return _mm256_maskload_ps(p, duet__v_mask_n(n));
}
DUET__V void duet__v_store_n(float *p, v_t v, int n)
{
    _mm256_maskstore_ps(p, duet__v_mask_n(n), v);
}
DUET__V v_t duet__v_add(v_t a, v_t b)
{
    return _mm256_add_ps(a, b);
}
DUET__V v_t duet__v_sub(v_t a, v_t b)
{
    return _mm256_sub_ps(a, b);
}
DUET__V v_t duet__v_mul(v_t a, v_t b)
{
    return _mm256_mul_ps(a, b);
}
DUET__V v_t duet__v_div(v_t a, v_t b)
{
    return _mm256_div_ps(a, b);
}
DUET__V v_t duet__v_max(v_t a, v_t b)
{
    return _mm256_max_ps(a, b);
}
DUET__V v_t duet__v_fma(v_t a, v_t b, v_t c)
{
    return _mm256_fmadd_ps(a, b, c);
}
DUET__V m_t duet__v_ge(v_t a, v_t b)
{
    return _mm256_cmp_ps(a, b, _CMP_GE_OQ);
}
DUET__V m_t duet__v_gt(v_t a, v_t b)
{
    return _mm256_cmp_ps(a, b, _CMP_GT_OQ);
}
DUET__V v_t duet__v_sel(m_t m, v_t a, v_t b)
{
    return _mm256_blendv_ps(b, a, m);
}
/* 2^x = 2^n 2^f as in ops_avx512.c; 2^n is built in the exponent field,
 * so x is clamped to [-126, 127] (results below 2^-126 come out as
 * denormals near 2^-126 instead of 0: harmless where used). */
DUET__V v_t duet__v_exp2(v_t x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-126.0f)), _mm256_set1_ps(127.0f));
    v_t n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v_t f = _mm256_sub_ps(x, n);
    v_t p = _mm256_set1_ps(1.5403530393381606e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428443e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291076284772e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504108664821580e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022650695910071e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718055994531e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
                                  23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
DUET__V float duet__v_hsum(v_t v)
{
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
DUET__V float duet__v_hmax(v_t v)
{
    __m128 q = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    q = _mm_max_ps(q, _mm_movehl_ps(q, q));
    q = _mm_max_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
/* 8 x 8 transpose: interleave row pairs, then 4-element groups within
 * 128-bit lanes, then swap 128-bit lanes; 24 shuffles. */
DUET__V void duet__v_transpose(v_t r[8])
{
    v_t a[8], b[8];
#pragma GCC unroll 16
    for (int i = 0; i < 4; i++) {
        a[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* b[4 q + c]: lane L holds column 4 L + c of rows 4 q .. 4 q + 3 */
#pragma GCC unroll 16
    for (int q = 0; q < 2; q++) {
        b[4 * q + 0] = _mm256_shuffle_ps(a[4 * q], a[4 * q + 2], 0x44);
        b[4 * q + 1] = _mm256_shuffle_ps(a[4 * q], a[4 * q + 2], 0xee);
        b[4 * q + 2] = _mm256_shuffle_ps(a[4 * q + 1], a[4 * q + 3], 0x44);
        b[4 * q + 3] = _mm256_shuffle_ps(a[4 * q + 1], a[4 * q + 3], 0xee);
    }
#pragma GCC unroll 16
    for (int c = 0; c < 4; c++) {
        r[c] = _mm256_permute2f128_ps(b[c], b[4 + c], 0x20);
        r[4 + c] = _mm256_permute2f128_ps(b[c], b[4 + c], 0x31);
    }
}
DUET__V v_t duet__v_lane_index(void)
{
    return _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
}
DUET__V v_t duet__v_load_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
DUET__V v_t duet__v_load_bf16(const uint16_t *p)
{
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

#include "engine/cpu/ops_simd.inc"

#pragma GCC pop_options

#endif
