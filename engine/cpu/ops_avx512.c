/* AVX-512 instantiation of the cpu backend's non-matmul kernels
 * (ops_simd.inc over the helpers of simd_avx512.inc): attention tiles of 3
 * row vectors x 8 keys/dims (24 accumulators).  Compiled for avx512f/dq +
 * fma + f16c and only used after the runtime CPU check in ops.c. */
#include "engine/cpu/ops_internal.h"

#if DUET__MM_X86

#include <float.h>
#include <math.h>
#include <string.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")

#define DUET__CT 3
#define DUET__JT 8
#define DUET__DT 8
#define DUET__SR 8
#define DUET__DV 4
#define DUET__KERNEL

#include "engine/cpu/simd_avx512.inc"

#include "engine/cpu/ops_simd.inc"

#pragma GCC pop_options

#endif
