/* AVX-512 instantiation of the cpu backend's non-matmul kernels
 * (ops_simd.inc): 16 lanes, attention tiles of 3 row vectors x 8 keys/dims
 * (24 accumulators).  Compiled for avx512f/dq + fma + f16c and only used
 * after the runtime CPU check in ops.c. */
#include "engine/cpu/ops_internal.h"

#if DUET__MM_X86

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")

#define DUET__W      16
#define DUET__CT     3
#define DUET__JT     8
#define DUET__DT     8
#define DUET__SR     8
#define DUET__DV     4
#define DUET__SFX(x) duet__##x##_avx512
#define DUET__NAME   "avx512"
#define DUET__KERNEL

typedef __m512 v_t;
typedef __mmask16 m_t;

#define DUET__V static inline __attribute__((always_inline))

DUET__V v_t duet__v_zero(void)
{
    return _mm512_setzero_ps();
}
DUET__V v_t duet__v_set1(float x)
{
    return _mm512_set1_ps(x);
}
DUET__V v_t duet__v_load(const float *p)
{
    return _mm512_loadu_ps(p);
}
DUET__V void duet__v_store(float *p, v_t v)
{
    _mm512_storeu_ps(p, v);
}
DUET__V v_t duet__v_load_n(const float *p, int n)
{
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
}
DUET__V void duet__v_store_n(float *p, v_t v, int n)
{
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), v);
}
DUET__V v_t duet__v_add(v_t a, v_t b)
{
    return _mm512_add_ps(a, b);
}
DUET__V v_t duet__v_sub(v_t a, v_t b)
{
    return _mm512_sub_ps(a, b);
}
DUET__V v_t duet__v_mul(v_t a, v_t b)
{
    return _mm512_mul_ps(a, b);
}
DUET__V v_t duet__v_div(v_t a, v_t b)
{
    return _mm512_div_ps(a, b);
}
DUET__V v_t duet__v_max(v_t a, v_t b)
{
    return _mm512_max_ps(a, b);
}
DUET__V v_t duet__v_fma(v_t a, v_t b, v_t c)
{
    return _mm512_fmadd_ps(a, b, c);
}
DUET__V m_t duet__v_ge(v_t a, v_t b)
{
    return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ);
}
DUET__V m_t duet__v_gt(v_t a, v_t b)
{
    return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ);
}
DUET__V v_t duet__v_sel(m_t m, v_t a, v_t b)
{
    return _mm512_mask_blend_ps(m, b, a);
}
/* 2^x = 2^n 2^f, n = round(x), |f| <= 1/2; 2^f by its Taylor series to
 * degree 6 (relative error < 1.2e-7), 2^n applied by vscalefps, which also
 * gives 0 for n below the denormals.  2^0 is exactly 1. */
DUET__V v_t duet__v_exp2(v_t x)
{
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-160.0f)), _mm512_set1_ps(128.0f));
    v_t n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v_t f = _mm512_sub_ps(x, n);
    v_t p = _mm512_set1_ps(1.5403530393381606e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}
DUET__V float duet__v_hsum(v_t v)
{
    __m256 s = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
DUET__V float duet__v_hmax(v_t v)
{
    __m256 s = _mm256_max_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 q = _mm_max_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    q = _mm_max_ps(q, _mm_movehl_ps(q, q));
    q = _mm_max_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
/* 16 x 16 transpose: interleave row pairs, then 4-element groups within
 * 128-bit lanes, then transpose the 4 x 4 grid of 128-bit lanes in two
 * steps; 64 shuffles. */
DUET__V void duet__v_transpose(v_t r[16])
{
    v_t a[16], b[16];
#pragma GCC unroll 16
    for (int i = 0; i < 8; i++) {
        a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* b[4 q + c]: lane L holds column 4 L + c of rows 4 q .. 4 q + 3 */
#pragma GCC unroll 16
    for (int q = 0; q < 4; q++) {
        b[4 * q + 0] = _mm512_shuffle_ps(a[4 * q], a[4 * q + 2], 0x44);
        b[4 * q + 1] = _mm512_shuffle_ps(a[4 * q], a[4 * q + 2], 0xee);
        b[4 * q + 2] = _mm512_shuffle_ps(a[4 * q + 1], a[4 * q + 3], 0x44);
        b[4 * q + 3] = _mm512_shuffle_ps(a[4 * q + 1], a[4 * q + 3], 0xee);
    }
#pragma GCC unroll 16
    for (int c = 0; c < 4; c++) {
        v_t e0 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0x88);
        v_t e1 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0xdd);
        v_t e2 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0x88);
        v_t e3 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0xdd);
        r[c] = _mm512_shuffle_f32x4(e0, e2, 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(e0, e2, 0xdd);
        r[4 + c] = _mm512_shuffle_f32x4(e1, e3, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(e1, e3, 0xdd);
    }
}
DUET__V v_t duet__v_lane_index(void)
{
    return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}
DUET__V v_t duet__v_load_f16(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
DUET__V v_t duet__v_load_bf16(const uint16_t *p)
{
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

#include "engine/cpu/ops_simd.inc"

#pragma GCC pop_options

#endif
