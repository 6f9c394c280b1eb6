/* AVX-512 micro-kernels (matmul_simd.inc over the helpers of
 * simd_avx512.inc): a kernel tile of up to 14 rows x 32 columns held in 28
 * zmm accumulators; kernel2 tiles of up to 6 rows x 64 columns (two panels:
 * with few rows a 32-column tile has too few independent FMA chains to cover
 * the FMA latency).  Compiled for avx512f/bw/vl + fma + f16c and only called
 * after the runtime CPU check in matmul.c. */
#include "engine/cpu/matmul_internal.h"

#if DUET__MM_X86

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")

#define DUET__MM_MR  14
#define DUET__MM_NV  2
#define DUET__MM_MR2 6
#define DUET__MM_NV2 4

#include "engine/cpu/simd_avx512.inc"

#include "engine/cpu/matmul_simd.inc"

#pragma GCC pop_options

#else

typedef int duet__mm_avx512_unavailable_t; /* ISO C wants a non-empty file */

#endif
