/* AVX2 micro-kernels (matmul_simd.inc over the helpers of simd_avx2.inc):
 * a kernel tile of up to 6 rows x 16 columns in 12 ymm accumulators, run
 * once per half of the 32-wide weight panel; kernel2 tiles of 1-2 rows x a
 * whole 32-column panel (8 accumulators: more independent FMA chains than
 * the 16-column tile has with so few rows).  Compiled for avx2 + fma + f16c
 * and only called after the runtime CPU check in matmul.c. */
#include "engine/cpu/matmul_internal.h"

#if DUET__MM_X86

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#define DUET__MM_MR  6
#define DUET__MM_NV  2
#define DUET__MM_MR2 2
#define DUET__MM_NV2 4

#include "engine/cpu/simd_avx2.inc"

#include "engine/cpu/matmul_simd.inc"

#pragma GCC pop_options

#else

typedef int duet__mm_avx2_unavailable_t; /* ISO C wants a non-empty file */

#endif
