/* AVX2 instantiation of the cpu backend's non-matmul kernels
 * (ops_simd.inc over the helpers of simd_avx2.inc): attention tiles of 2
 * row vectors x 4 keys/dims (16 ymm registers leave room for 8
 * accumulators).  Compiled for avx2 + fma + f16c and only used after the
 * runtime CPU check in ops.c. */
#include "engine/cpu/ops_internal.h"

#if DUET__MM_X86

#include <float.h>
#include <math.h>
#include <string.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#define DUET__CT 2
#define DUET__JT 4
#define DUET__DT 4
#define DUET__SR 4
#define DUET__DV 2
#define DUET__KERNEL

#include "engine/cpu/simd_avx2.inc"

#include "engine/cpu/ops_simd.inc"

#pragma GCC pop_options

#endif
