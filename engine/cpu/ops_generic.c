/* Portable C instantiation of the cpu backend's non-matmul kernels
 * (ops_simd.inc) with one-lane "vectors": multiply then add (ISO C does
 * not contract to FMA) and libm's exp2f, so results differ from the SIMD
 * tables by rounding.  Used where neither AVX2 nor AVX-512 is available. */
#include "engine/cpu/ops_internal.h"

#include <float.h>
#include <math.h>
#include <string.h>

#define DUET__W      1
#define DUET__CT     4
#define DUET__JT     4
#define DUET__DT     4
#define DUET__SR     0 /* one lane: the wide kernel wastes nothing */
#define DUET__DV     1
#define DUET__SFX(x) duet__##x##_generic
#define DUET__NAME   "generic"
#define DUET__KERNEL

typedef float v_t;
typedef int m_t;

#define DUET__V static inline __attribute__((always_inline))

DUET__V v_t duet__v_zero(void)
{
    return 0.0f;
}
DUET__V v_t duet__v_set1(float x)
{
    return x;
}
DUET__V v_t duet__v_load(const float *p)
{
    return *p;
}
DUET__V void duet__v_store(float *p, v_t v)
{
    *p = v;
}
/* never called with one lane (0 < n < W is empty); defined for the template */
DUET__V v_t duet__v_load_n(const float *p, int n)
{
    (void)n;
    return *p;
}
DUET__V void duet__v_store_n(float *p, v_t v, int n)
{
    (void)n;
    *p = v;
}
DUET__V v_t duet__v_add(v_t a, v_t b)
{
    return a + b;
}
DUET__V v_t duet__v_sub(v_t a, v_t b)
{
    return a - b;
}
DUET__V v_t duet__v_mul(v_t a, v_t b)
{
    return a * b;
}
DUET__V v_t duet__v_div(v_t a, v_t b)
{
    return a / b;
}
DUET__V v_t duet__v_max(v_t a, v_t b)
{
    return a > b ? a : b;
}
DUET__V v_t duet__v_fma(v_t a, v_t b, v_t c)
{
    return a * b + c;
}
DUET__V m_t duet__v_ge(v_t a, v_t b)
{
    return a >= b;
}
DUET__V m_t duet__v_gt(v_t a, v_t b)
{
    return a > b;
}
DUET__V v_t duet__v_sel(m_t m, v_t a, v_t b)
{
    return m ? a : b;
}
DUET__V v_t duet__v_exp2(v_t x)
{
    return exp2f(x);
}
DUET__V float duet__v_hsum(v_t v)
{
    return v;
}
DUET__V float duet__v_hmax(v_t v)
{
    return v;
}
DUET__V void duet__v_transpose(v_t r[1])
{
    (void)r;
}
DUET__V v_t duet__v_lane_index(void)
{
    return 0.0f;
}
DUET__V v_t duet__v_load_f16(const uint16_t *p)
{
    return duet_f16_to_f32(*p);
}
DUET__V v_t duet__v_load_bf16(const uint16_t *p)
{
    return duet_bf16_to_f32(*p);
}

#include "engine/cpu/ops_simd.inc"
