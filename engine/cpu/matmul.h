/* Dense layers on the CPU: y[n][m] = x[n][k] . W[m][k]^T (+ bias[m]).
 *
 * Weights are packed once at load into a kernel-private layout in one of
 * F32, F16 or BF16 (activations and accumulation are always f32).  The
 * kernel is chosen at run time from the CPU's features (AVX-512, AVX2+FMA,
 * portable C) and from n: a bandwidth-bound path for small n (decode) and a
 * blocked, compute-bound GEMM for large n (prefill).  All paths give the
 * same result up to f32 summation order; in fact every output is one FMA
 * chain in k order, so for a given kernel family the result is bit-identical
 * whatever n, the batch it is part of, the strides or the pool size (AVX2
 * and AVX-512 agree bit for bit; the portable C kernel differs by rounding).
 *
 * DUET_CPU_ISA=generic|avx2|avx512 (read once) forces a lower kernel family;
 * a family the CPU lacks is refused with a warning. */
#ifndef DUET_ENGINE_CPU_MATMUL_H
#define DUET_ENGINE_CPU_MATMUL_H

#include <stddef.h>

#include "common/status.h"
#include "engine/cpu/pool.h"
#include "kv/dtype.h"

typedef struct {
    duet_dtype_t dtype; /* storage dtype: F32, F16 or BF16 */
    int rows;           /* m: output features */
    int cols;           /* k: input features */
    void *data;         /* packed, duet_aligned_alloc'd */
    size_t bytes;
} duet_cpu_weight_t;

/* Pack rows [row0, row0+rows) x columns [col0, col0+cols) of a row-major
 * source matrix with src_cols columns and dtype src_dtype, storing as
 * store_dtype.  This is how a rank takes its TP shard (column- or
 * row-parallel) straight from the memory-mapped checkpoint.  Conversions
 * round to nearest even.  The caller guarantees the source has at least
 * row0 + rows rows.  Fails with DUET_ERR_INVALID (bad block),
 * DUET_ERR_UNSUPPORTED (dtype) or DUET_ERR_NO_MEMORY; *w_p is set only on
 * success.  The packed weight is read-only afterwards: any number of threads
 * and pools may use it at once.  duet_cpu_weight_free() accepts NULL and an
 * already freed weight. */
duet_status_t duet_cpu_weight_pack(const void *src, duet_dtype_t src_dtype, int src_cols, int row0,
                                   int rows, int col0, int cols, duet_dtype_t store_dtype,
                                   duet_cpu_weight_t *w_p);
void duet_cpu_weight_free(duet_cpu_weight_t *w);

/* y[n][w->rows] = x[n][w->cols] . W^T + bias; bias may be NULL.  x and y
 * are row-major with the given row strides (in floats; y must not overlap
 * x).  Runs on the workers of pool (required; its per-worker scratch is
 * used) and returns when y is complete; call it from the pool's owner, not
 * from inside a pool job.  n <= 0 does nothing. */
void duet_cpu_matmul(duet_cpu_pool_t *pool, float *y, size_t ldy, const float *x, size_t ldx, int n,
                     const duet_cpu_weight_t *w, const float *bias);

/* Which kernel family runs on this CPU ("avx512", "avx2", "generic"). */
const char *duet_cpu_matmul_isa(void);

#endif
