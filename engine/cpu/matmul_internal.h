/* Internals of the CPU matmul shared by matmul.c and the per-ISA kernel
 * files (matmul_avx512.c and matmul_avx2.c, which instantiate
 * matmul_simd.inc, and matmul_generic.c).
 *
 * Packed weight layout: the m output rows are cut into panels of NR = 32
 * rows (the last one zero-padded); panel p holds W[p*NR + j][kk] at
 * element (p*k + kk)*NR + j.  One k step of a panel is 32 consecutive
 * values (two AVX-512 vectors of f32, one of f16/bf16), and a whole panel is
 * one contiguous run of k*NR elements, so the decode path streams memory
 * linearly and the GEMM path finds a kc x NR block contiguous as well.
 *
 * Packed activations: rows of x copied into a scratch block with the fixed
 * row stride LDA floats (kc <= KC <= LDA), so a kernel addresses row r of
 * its tile with an immediate offset.
 *
 * The micro-kernel computes a tile C[mr][NR] over one kc block, every
 * output as one fused multiply-add chain in k order.  Every path, thread
 * count and batch size therefore gives bit-identical results for a given
 * ISA (and AVX2 equals AVX-512); only the generic C kernel (no FMA) differs,
 * by rounding. */
#ifndef DUET_ENGINE_CPU_MATMUL_INTERNAL_H
#define DUET_ENGINE_CPU_MATMUL_INTERNAL_H

#include <stddef.h>

#include "engine/cpu/matmul.h"

#define DUET__MM_NR 32 /* weight panel width (output features) */
#ifndef DUET__MM_KC
#define DUET__MM_KC 512 /* largest k block */
#endif
#define DUET__MM_LDA (DUET__MM_KC + 16) /* row stride of packed x, floats (+16: set aliasing) */

/* Kernel flags. */
#define DUET__MM_ACCUM 1u /* C holds a partial sum from earlier k blocks: add to it */

typedef enum {
    DUET__MM_ISA_GENERIC = 0,
    DUET__MM_ISA_AVX2 = 1,
    DUET__MM_ISA_AVX512 = 2,
} duet__mm_isa_t;

/* C[r][0..nc) (+)= sum_kk a[r*LDA + kk] * b[kk*NR + j], r < mr, then
 * + bias[j] when bias != NULL (the last k block).  b is a kc x NR block of
 * a panel in the kernel's dtype; nc <= NR columns are stored.  pf: the
 * kernel prefetches (into L2) the kc lines of 64 bytes from pf on, one per k
 * step, so that the weight block needed next arrives while this tile
 * computes; pass an address already in cache when there is nothing to
 * fetch. */
typedef void (*duet__mm_kernel_fn)(int mr, int kc, const float *a, const void *b, float *c,
                                   size_t ldc, int nc, const float *bias, unsigned flags,
                                   const char *pf);
/* The same over two panels: columns [0, 32) from block b, [32, 64) from
 * block b2 (the next panel), nc <= 64, bias covering both; mr <= mr2.  It
 * prefetches the whole kc x NR blocks at pf and pf2 (the blocks that follow
 * b and b2 in memory; pass b and b2 at the end of a range). */
typedef void (*duet__mm_kernel2_fn)(int mr, int kc, const float *a, const void *b, const void *b2,
                                    float *c, size_t ldc, int nc, const float *bias, unsigned flags,
                                    const char *pf, const char *pf2);
/* Widen n elements of F16 or BF16 to f32 (n a multiple of 32). */
typedef void (*duet__mm_widen_fn)(const void *src, float *dst, size_t n);

typedef struct {
    const char *name;
    int mr;                       /* rows per tile (register blocking) */
    duet__mm_kernel_fn kernel[3]; /* by storage dtype F32/F16/BF16 (NULL: widen) */
    int mr2;                      /* largest tile for kernel2; 0: none */
    duet__mm_kernel2_fn kernel2[3];
    duet__mm_widen_fn widen[3]; /* [F16], [BF16]; [F32] unused */
    /* Widen an F16/BF16 kc x NR block to f32 once when at least this many
     * tiles reuse it; with fewer, kernel[F16/BF16] converts as it goes. */
    int widen_min_tiles;
} duet__mm_ops_t;

/* The SIMD families exist on x86-64 with GCC-compatible compilers only
 * (-DDUET__MM_X86=0 builds the portable code alone, to check it builds). */
#ifndef DUET__MM_X86
#if defined(__x86_64__) && defined(__GNUC__)
#define DUET__MM_X86 1
#else
#define DUET__MM_X86 0
#endif
#endif

extern const duet__mm_ops_t duet__mm_ops_generic;
#if DUET__MM_X86
extern const duet__mm_ops_t duet__mm_ops_avx2;
extern const duet__mm_ops_t duet__mm_ops_avx512;
#endif

/* The best ISA this CPU supports, ignoring DUET_CPU_ISA. */
duet__mm_isa_t duet__mm_isa_detect(void);
/* The ISA to use given the detected one and a DUET_CPU_ISA value (NULL or
 * "" = no override).  A request above what the CPU supports, or an unknown
 * name, yields the detected ISA and *ignored_p = 1. */
duet__mm_isa_t duet__mm_isa_choose(duet__mm_isa_t detected, const char *env, int *ignored_p);
const char *duet__mm_isa_name(duet__mm_isa_t isa);

/* duet_cpu_matmul with an explicit ISA, for tests and benchmarks that
 * compare kernel families in one process; an ISA above the detected one
 * runs as the detected one. */
void duet__cpu_matmul_isa(duet__mm_isa_t isa, duet_cpu_pool_t *pool, float *y, size_t ldy,
                          const float *x, size_t ldx, int n, const duet_cpu_weight_t *w,
                          const float *bias);

#endif
